"""`compare`: the same job under every engine with its real launcher, tabulated, saved and plotted."""

from __future__ import annotations

import json

import pytest
from support.jobs import BIN, assert_ok, run

COMPARE = [str(BIN / "python"), "-m", "horovod_train", "compare"]

JOB = [
    "--synthetic_num_examples",
    "400",
    "--per_device_train_batch_size",
    "8",
    "--per_device_eval_batch_size",
    "40",
    "--max_steps",
    "6",
    "--logging_steps",
    "3",
    "--dropout",
    "0",
    "--disable_tqdm",
]

CPU_RUNS = ["horovod-gloo", "horovod-mpi", "ddp-gloo", "fsdp-gloo", "zero1-gloo", "single", "dp"]


@pytest.mark.slow
def test_compare_runs_every_engine_on_the_same_job(tmp_path, cache_dir):
    out = tmp_path / "compare"
    proc = run([*COMPARE, *JOB, "--output_dir", str(out)], cache_dir, timeout=600)
    assert_ok(proc)
    report = json.loads((out / "compare.json").read_text())
    runs = report["runs"]
    assert [r["name"] for r in runs] == CPU_RUNS and all(r["ok"] for r in runs)
    assert [r["world_size"] for r in runs] == [2, 2, 2, 2, 2, 1, 1] and report["global_batch"] == 16
    assert [len(r["peak_memory_mb_per_rank"]) for r in runs] == [2, 2, 2, 2, 2, 1, 1]
    assert all(m > 50 for r in runs for m in r["peak_memory_mb_per_rank"])
    assert all(r["samples_per_second"] > 0 and r["tokens_per_second"] > 0 for r in runs)
    # The same job: same global batches and gradients, so the same loss and accuracy on every engine.
    losses = [r["final_train_loss"] for r in runs]
    assert max(losses) - min(losses) < 1e-4, losses
    assert len({r["validation_accuracy"] for r in runs}) == 1
    header = "engine        launcher    world  samples/s  tokens/s  train loss  val acc  peak MiB/rank"
    assert header in proc.stdout
    for r in runs:
        assert r["name"] in proc.stdout and (out / r["name"] / "model.safetensors").is_file()
        assert (out / "logs" / f"{r['name']}.log").is_file()
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Global batch 2 x 8 on a CPU machine: one process (single, dp) reads batches of 16.
    for name in ("single", "dp"):
        config = json.loads((out / name / "run_config.json").read_text())
        assert config["per_device_train_batch_size"] == 16 and config["engine"] == name
