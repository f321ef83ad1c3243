"""The DDP and DataParallel engines on their own: uneven shards, launch mistakes, bad input."""

from __future__ import annotations

import pytest
from support.jobs import SMALL_JOB, assert_ok, read_results, run, torchrun, train_here


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
    assert results["eval_accuracy_per_rank"] == [results["eval_accuracy"]] * 2
    assert len(set(results["param_checksum_per_rank"])) == 1
    assert len(results["peak_memory_mb_per_rank"]) == 2


@pytest.mark.slow
def test_dp_on_cpu_says_so_once_and_trains(tmp_path, cache_dir):
    out = tmp_path / "dp"
    proc = train_here(cache_dir, *SMALL_JOB, "--engine", "dp", "--max_steps", "5", "--output_dir", str(out))
    assert_ok(proc)
    assert proc.stdout.count("no GPU visible") == 1
    results = read_results(out)
    assert (results["engine"], results["replicas"], results["global_step"]) == ("dp", 1, 5)


@pytest.mark.slow
def test_single_refuses_the_two_ranks_of_a_real_torchrun(tmp_path, cache_dir):
    out = tmp_path / "out"
    proc = run(torchrun(2, *SMALL_JOB, "--engine", "single", "--output_dir", str(out)), cache_dir, timeout=120)
    assert proc.returncode != 0
    assert "error: --engine single runs one process but torchrun started 2" in proc.stderr
    assert not out.exists()


# What torchrun gives its first worker of two (the real launch: the test above).
TORCHRUN_RANK_0 = {"TORCHELASTIC_RUN_ID": "none", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                   "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # fmt: skip


def test_dp_refuses_a_torchrun_workers_rank_as_single_does(tmp_path, cache_dir, monkeypatch):
    """dp's own setup makes the check single's makes (single.refuse_a_launcher): in this process, as rank 0 of 2."""
    for name, value in TORCHRUN_RANK_0.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "out"
    proc = train_here(cache_dir, *SMALL_JOB, "--engine", "dp", "--output_dir", str(out))
    assert proc.returncode != 0
    assert "error: --engine dp runs one process but torchrun started 2" in proc.stderr
    assert not out.exists()


@pytest.mark.slow
def test_ddp_find_unused_parameters_lets_a_model_with_an_idle_parameter_train(tmp_path, cache_dir):
    from support.jobs import BIN, REPO, probe_launch

    def probe(find_unused: str):
        program = [str(BIN / "python"), str(REPO / "tests" / "probes" / "ddp_unused_probe.py"), find_unused]
        return run(probe_launch("torchrun", program), cache_dir, timeout=180)

    failing = probe("false")  # DDP waits for the idle head's gradient and fails at the second step
    assert failing.returncode != 0 and "step 2 done" not in failing.stdout
    assert "find_unused_parameters" in failing.stdout + failing.stderr
    assert_ok(working := probe("true"))
    assert working.stdout.count("step 2 done") == 2
