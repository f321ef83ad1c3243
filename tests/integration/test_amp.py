"""Mixed precision and length-grouped batching: bf16 learns on CPU, fp32 stays bit-identical, fp16's
GradScaler order is unscale -> clip -> step -> update, and the grouped sampler shards like DistributedSampler."""

from __future__ import annotations

import json

import pytest
from support.jobs import assert_ok, read_results, run, train_here

LEARNING_JOB = [
    "--engine", "single", "--synthetic_num_examples", "2000", "--per_device_train_batch_size", "32",
    "--per_device_eval_batch_size", "100", "--learning_rate", "5e-4", "--num_train_epochs", "4",
    "--warmup_ratio", "0.1", "--logging_steps", "10", "--disable_tqdm",
]  # fmt: skip


def test_bf16_training_learns_on_cpu(tmp_path, cache_dir):
    out = tmp_path / "bf16"
    proc = train_here(cache_dir, *LEARNING_JOB, "--bf16", "--group_by_length", "--output_dir", str(out))
    assert_ok(proc)
    results = read_results(out)
    assert results["eval_accuracy"] > 0.6, results["history"]  # chance is 0.33
    config = json.loads((out / "run_config.json").read_text())
    assert config["bf16"] is True and config["fp16"] is False and config["group_by_length"] is True


@pytest.mark.slow
def test_elastic_state_carries_the_grad_scaler_across_a_resize_and_a_rollback(tmp_path, cache_dir):
    """--elastic --fp16: a worker that joins must take the survivors' loss scale, not start at 65536, and a
    rollback to the last commit must restore the scale committed with the weights."""
    from support.jobs import BIN, REPO, probe_launch

    probe = [str(BIN / "python"), str(REPO / "tests" / "probes" / "elastic_scaler_probe.py"), str(tmp_path)]
    assert_ok(run(probe_launch("horovodrun", probe), cache_dir, timeout=180))
    reports = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    committed = {"scale": 1024.0, "growth_tracker": 7}
    assert reports[1]["before_sync"] == {"scale": 65536.0, "growth_tracker": 0}
    for report in reports:
        assert report["after_sync"] == committed and report["after_restore"] == committed
