"""Real 2-rank Horovod runs (Gloo under horovodrun, the MPI controller under mpirun)."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest
from support.jobs import REPO, SMALL_JOB, assert_ok, base_env, horovodrun, mpirun, read_results, run
from support.metrics import recompute_metrics
from transformers import pipeline

from horovod_train.config.run_config import DataArguments

pytestmark = pytest.mark.slow


def check_metrics_jsonl(path: Path, expected_last_step: int) -> None:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records, "metrics.jsonl is empty"
    keys = {"step", "epoch", "loss", "learning_rate", "samples_per_second", "tokens_per_second"}
    for record in records:
        assert keys <= set(record), record
        assert record["loss"] > 0 and record["samples_per_second"] > 0 and record["tokens_per_second"] > 0
    steps = [r["step"] for r in records]
    assert steps == sorted(set(steps)) and steps[-1] == expected_last_step


# One job per launcher, each launched once and read by the tests below. Under Gloo, 1001 examples: neither split
# (900 train, 101 validation) divides evenly over 2 ranks with these batches (pad, gather, trim). Under mpirun,
# Adasum: it steps each rank's optimizer inside the backward pass and combines the updates over MPI (no clipping:
# --max_grad_norm 0).
JOBS = {
    "horovodrun-gloo": ["--synthetic_num_examples", "1001", "--per_device_train_batch_size", "7",
                        "--per_device_eval_batch_size", "13"],
    "mpirun": ["--op", "adasum", "--max_grad_norm", "0"],
}  # fmt: skip
EXAMPLES = {"horovodrun-gloo": (1001, 101), "mpirun": (1200, 120)}  # (in all, validation)
STEPS_PER_EPOCH = {  # one rank's shard of the training split over its batch, rounded up
    "horovodrun-gloo": math.ceil(900 / 2 / 7),
    "mpirun": math.ceil(1080 / 2 / 16),
}


def train_two_ranks(launcher: str, out: Path, cache_dir: Path) -> subprocess.CompletedProcess:
    args = [*SMALL_JOB, *JOBS[launcher], "--num_train_epochs", "3", "--output_dir", str(out)]
    cmd = horovodrun(2, *args) if launcher == "horovodrun-gloo" else mpirun(2, *args)
    return run(cmd, cache_dir, timeout=420)


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory, cache_dir) -> Path:
    out = tmp_path_factory.mktemp("gloo") / "run"
    assert_ok(train_two_ranks("horovodrun-gloo", out, cache_dir))
    return out


@pytest.fixture(scope="module")
def mpi_run(tmp_path_factory, cache_dir) -> Path:
    out = tmp_path_factory.mktemp("mpi") / "run"
    assert_ok(train_two_ranks("mpirun", out, cache_dir))
    return out


@pytest.mark.parametrize("launcher", JOBS)
def test_two_ranks_train_identically_and_report_exact_accuracy(launcher, request):
    out = request.getfixturevalue({"horovodrun-gloo": "gloo_run", "mpirun": "mpi_run"}[launcher])
    results = read_results(out)
    assert results["world_size"] == 2 and results["engine"] == "horovod"
    assert results["controller"] == ("gloo" if launcher == "horovodrun-gloo" else "mpi")

    # Parameters are bit-identical on both ranks after training.
    checksums = results["param_checksum_per_rank"]
    assert len(checksums) == 2 and checksums[0] == checksums[1]

    # Every rank reports the same metrics, over every validation example once, equal to a recomputation.
    examples, validation = EXAMPLES[launcher]
    expected = recompute_metrics(out, DataArguments(synthetic_num_examples=examples), seed=42)
    assert results["eval_samples"] == expected["n"] == validation
    assert results["eval_accuracy_per_rank"] == [results["eval_accuracy"]] * 2
    assert results["eval_accuracy"] == pytest.approx(expected["accuracy"], abs=1e-12)
    assert results["eval_f1"] == pytest.approx(expected["f1"], abs=1e-12)
    assert results["eval_loss"] == pytest.approx(expected["loss"], rel=1e-5)

    check_metrics_jsonl(out / "metrics.jsonl", expected_last_step=3 * STEPS_PER_EPOCH[launcher])

    classifier = pipeline("text-classification", model=str(out), device=-1)
    prediction = classifier(
        {"text": "alice moved the lamp next to the chair in the attic .", "text_pair": "alice moved the lamp ."}
    )
    assert prediction["label"] in {"entailment", "neutral", "contradiction"}


def test_demo_job_reaches_080_and_its_output_reads_like_a_log(tmp_path, cache_dir):
    """`make demo` as it runs it: 2 ranks under horovodrun's MPI controller (which tags every line with
    the rank), output captured: no progress-bar redraws, one log line per --logging_steps from rank 0,
    and the result as the last line."""
    out = tmp_path / "demo"
    cmd = horovodrun(2, "--config", "configs/demo.yaml", "--output_dir", str(out), controller="--mpi")
    proc = subprocess.run(cmd, cwd=REPO, env=base_env(cache_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
    results = read_results(out)
    assert results["eval_accuracy"] >= 0.80, results["history"]
    assert "\r" not in proc.stdout and "it/s" not in proc.stdout, proc.stdout[-2000:]
    lines = [re.sub(r"^\[\d+,\d+\]<std(out|err)>:", "", line) for line in proc.stdout.splitlines() if line.strip()]
    assert not [line for line in lines if "]<std" in line], lines[-5:]  # a rank tag only at a line's start
    result = r"validation accuracy [01]\.\d{4} \(f1 [01]\.\d{4}, \d+ examples; chance 0\.33\); horovod, world size 2, "
    assert re.fullmatch(result + r"[\d.]+s", lines[-1]), lines[-5:]
    step = r"step \d+/\d+ epoch [\d.]+ loss [\d.]+ lr [\d.e+-]+ [\d.]+ samples/s elapsed [\d:]+ eta [\d:]+"
    steps = [line for line in lines if re.fullmatch(step, line)]
    assert len(steps) == len((out / "metrics.jsonl").read_text().splitlines()), lines[:20]  # rank 0's only
    for name in ("metrics.jsonl", "all_results.json", "config.json", "model.safetensors", "tokenizer.json"):
        assert (out / name).is_file(), name


def test_adasum_trains_under_the_mpi_controller_and_is_refused_under_gloo(mpi_run, tmp_path, cache_dir):
    """mpirun's job trains with Adasum (JOBS); Horovod has no Adasum over Gloo (refused, not a crash)."""
    results = read_results(mpi_run)
    steps = 3 * STEPS_PER_EPOCH["mpirun"]
    assert (results["op"], results["controller"], results["global_step"]) == ("adasum", "mpi", steps)
    assert len(set(results["param_checksum_per_rank"])) == 1
    args = [*SMALL_JOB, *JOBS["mpirun"], "--max_steps", "20", "--output_dir", str(tmp_path / "gloo")]
    gloo = run(horovodrun(2, *args), cache_dir, timeout=300)
    assert gloo.returncode != 0 and "error: --op adasum needs Horovod's MPI controller" in gloo.stdout + gloo.stderr
    assert "/horovod_train/" not in gloo.stdout + gloo.stderr, "a rank printed a traceback"
    assert not (tmp_path / "gloo").exists()
