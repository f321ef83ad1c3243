"""Horovod with torch.compile at np=2 under horovodrun, checked on the CPU, its batches padded to length buckets
(issue 59: a graph per bucket) and compared with the eager single process; the same launch carries train's
--horovod_timeline and --autotune flags (one 2-rank job: its start-up, not its steps, is the cost).

The backend is aot_eager: TorchDynamo and AOTAutograd, which is what compiling changes about autograd (one compiled
backward, the gradient hooks Horovod's optimizer needs firing at its end) on GPUs and CPUs alike, without the code
generation. Inductor's for a CPU (C++ kernels, which no GPU run uses) took about 75 CPU-seconds a rank here; its
GPU kernels are the GPU check's (bench_compile_b128, docs/performance.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.jobs import SMALL_JOB, assert_ok, base_env, cli_here, horovodrun, read_results, run

# No dropout (each rank draws its own masks), batches padded to two bucket lengths, logged at every step.
EQUAL_TO_EAGER = ["--dropout", "0", "--length_buckets", "2", "--pad_to_multiple_of", "8", "--logging_steps", "1"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, cache_dir) -> tuple[Path, Path]:
    """One horovodrun -np 2 job: compiled, with a timeline and autotuning. Its output and timeline."""
    root = tmp_path_factory.mktemp("compiled")
    out, timeline = root / "run", root / "tl" / "timeline.json"
    args = [*SMALL_JOB, "--engine", "horovod", "--torch_compile_backend", "aot_eager", "--max_steps", "4"]
    args += [*EQUAL_TO_EAGER, "--output_dir", str(out)]
    args += ["--horovod_timeline", str(timeline), "--autotune"]
    assert_ok(run(horovodrun(2, *args), cache_dir, timeout=600))
    return out, timeline


@pytest.mark.slow
def test_horovod_with_torch_compile_trains_identical_replicas_at_np2(compiled):
    """The compiled model's gradient hooks still fire (all at the end of the one compiled backward: no
    overlap, docs/performance.md), and both ranks end with the same weights."""
    results = read_results(compiled[0])
    assert results["world_size"] == 2 and results["global_step"] == 4
    assert len(set(results["param_checksum_per_rank"])) == 1
    config = json.loads((compiled[0] / "run_config.json").read_text())
    assert config["torch_compile"] is True and config["torch_compile_backend"] == "aot_eager"


@pytest.mark.slow
def test_train_timeline_and_autotune_flags(compiled):
    """train's own flags (not horovodrun's) reach Horovod: rank 0 writes the timeline, autotuning is on."""
    out, timeline = compiled
    text = timeline.read_text()
    assert "NEGOTIATE_ALLREDUCE" in text and "ALLREDUCE" in text
    config = json.loads((out / "run_config.json").read_text())
    assert config["horovod_env"]["HOROVOD_TIMELINE"] == str(timeline)
    assert config["horovod_env"]["HOROVOD_AUTOTUNE"] == "1"
    assert config["gradient_groups"] == 1  # the CPU default: tiny-bert's 2.2 MB of gradients fit one 4 MiB bucket


def logged_losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_compiled_horovod_at_np2_trains_as_the_eager_single_process(compiled, tmp_path, cache_dir):
    """The same global batch of 32 (2 ranks x 16), eager in one process, unpadded to buckets: the compiled,
    bucketed, all-reduced steps log the same losses within float tolerance."""
    eager = tmp_path / "eager"
    args = [*SMALL_JOB, "--engine", "single", "--max_steps", "4", "--dropout", "0", "--logging_steps", "1"]
    args += ["--per_device_train_batch_size", "32", "--output_dir", str(eager)]
    assert_ok(cli_here(["train", *args], base_env(cache_dir)))
    compiled_losses, eager_losses = logged_losses(compiled[0]), logged_losses(eager)
    assert len(compiled_losses) == len(eager_losses) == 4
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-4)
