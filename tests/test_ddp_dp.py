"""The DDP and DataParallel engines on their own: uneven shards, launch mistakes, bad input."""

from __future__ import annotations

import pytest
from conftest import SMALL_JOB, assert_ok, read_results, run, torchrun, train_cmd

from horovod_train.cli import main


@pytest.mark.slow
def test_ddp_gathers_uneven_shards_exactly(tmp_path, cache_dir):
    """1001 examples: 101 validation examples, so rank 0 evaluates 51 and rank 1 50 (pad, gather, trim)."""
    out = tmp_path / "ddp"
    args = [*SMALL_JOB, "--synthetic_num_examples", "1001", "--per_device_train_batch_size", "7"]
    args += ["--per_device_eval_batch_size", "13", "--max_steps", "12", "--ddp_bucket_cap_mb", "1"]
    proc = run(torchrun(2, *args, "--engine", "ddp", "--output_dir", str(out)), cache_dir, timeout=300)
    assert_ok(proc)
    results = read_results(out)
    assert (results["engine"], results["world_size"], results["launcher"]) == ("ddp", 2, "torchrun")
    assert (results["backend"], results["ddp_bucket_cap_mb"], results["eval_samples"]) == ("gloo", 1, 101)
    assert results["accuracy_per_rank"] == [results["accuracy"]] * 2
    assert len(set(results["param_checksum_per_rank"])) == 1
    assert len(results["peak_memory_mb_per_rank"]) == 2


@pytest.mark.slow
def test_dp_on_cpu_says_so_once_and_trains(tmp_path, cache_dir):
    out = tmp_path / "dp"
    proc = run(train_cmd(*SMALL_JOB, "--engine", "dp", "--max_steps", "5", "--output_dir", str(out)), cache_dir)
    assert_ok(proc)
    assert proc.stdout.count("no GPU visible") == 1
    results = read_results(out)
    assert (results["engine"], results["replicas"], results["global_step"]) == ("dp", 1, 5)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["single", "dp"])
def test_one_process_engines_refuse_a_launcher(engine, tmp_path, cache_dir):
    out = tmp_path / "out"
    proc = run(torchrun(2, *SMALL_JOB, "--engine", engine, "--output_dir", str(out)), cache_dir, timeout=120)
    assert proc.returncode != 0
    assert f"error: --engine {engine} runs one process but torchrun started 2" in proc.stderr
    assert not out.exists()


def test_ddp_bucket_cap_must_be_positive(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--engine", "ddp", "--ddp_bucket_cap_mb", "0", "--output_dir", str(out)])
    assert exit_info.value.code == 2
    assert "--ddp_bucket_cap_mb must be > 0" in capsys.readouterr().err
    assert not out.exists()
