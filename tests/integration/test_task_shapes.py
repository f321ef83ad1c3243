"""Issue 21's task shapes under real launchers: a regression (--task_name stsb on an STS-B-like CSV) and a
multi-label run (JSONL lists of label names) train with 2 ranks (the first under `horovodrun`, the second DDP
under `torchrun`), end with the single process's parameters (<= 1e-5 after 20 steps, dropout off, as
test_engine_equivalence.py checks classification), and write run_glue's metrics and predictions."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest
from safetensors.torch import load_file
from support.jobs import assert_ok, horovodrun, read_results, run, torchrun, train_here
from support.task_data import TOPICS, write_multi_label_jsonl, write_regression_csv

TOLERANCE = 1e-5
STEPS = 20
# test_engine_equivalence.py's run, on these files: dropout off, Adam's eps 1e-6 (see docs/equivalence.md).
JOB = ["--model_name_or_path", "tiny-bert", "--per_device_eval_batch_size", "80", "--learning_rate", "2e-4",
       "--warmup_steps", "5", "--weight_decay", "0.01", "--max_steps", str(STEPS), "--logging_steps", "10",
       "--dropout", "0", "--adam_epsilon", "1e-6", "--disable_tqdm"]  # fmt: skip
B = 8  # per-rank batch of the 2-rank runs; the single process takes 2B
TRAIN, TEST = 400, 9  # 40 examples held out for validation

SHAPES = {
    "regression": (write_regression_csv, "csv", ["--task_name", "stsb"]),
    "multi_label": (write_multi_label_jsonl, "jsonl", []),
}
EXPECTED_METRICS = {
    "regression": {"pearson", "spearmanr", "combined_score"},
    "multi_label": {"accuracy", "f1_micro", "f1_macro"},
}
PROBLEM_TYPES = {"regression": "regression", "multi_label": "multi_label_classification"}
# Each shape under one 2-rank engine, each engine once: the shape is the trainer's (its loss, metrics and
# predictions, gathered by the engine's all_gather), and every engine's equivalence on classification is
# test_engine_equivalence.py's. The bad task-shape inputs are support/bad_input.py's cases (tests/unit).
CASES = {"regression": ("horovod-gloo", horovodrun, "horovod"), "multi_label": ("ddp-torchrun", torchrun, "ddp")}


def data_args(root: Path, shape: str) -> list[str]:
    write, suffix, extra = SHAPES[shape]
    train, test = root / f"{shape}-train.{suffix}", root / f"{shape}-test.{suffix}"
    if not train.exists():
        write(train, TRAIN, seed=0)
        write(test, TEST, seed=1)
    return [*JOB, *extra, "--train_file", str(train), "--test_file", str(test), "--do_predict"]


def train(root: Path, out: Path, cache_dir: Path, shape: str, launcher, engine: str, batch: int) -> dict:
    args = [*data_args(root, shape), "--engine", engine, "--per_device_train_batch_size", str(batch)]
    args += ["--output_dir", str(out)]
    # The single process trains in this one: its numbers are the same (one thread, as a rank's).
    proc = run(launcher(2, *args), cache_dir, timeout=300) if launcher else train_here(cache_dir, *args)
    assert_ok(proc)
    results = read_results(out)
    assert results["engine"] == engine and results["global_step"] == STEPS
    assert len(set(results["param_checksum_per_rank"])) == 1, "ranks disagree"
    return results


def check_outputs(out: Path, shape: str, results: dict) -> None:
    """eval_results.json has the shape's metrics (and only those), in range; predictions are floats or lists."""
    evals = json.loads((out / "eval_results.json").read_text())
    metrics = {k.removeprefix("eval_") for k in evals} - {"loss", "samples", "runtime", "samples_per_second", "epoch"}
    assert metrics == EXPECTED_METRICS[shape], sorted(evals)
    assert evals["eval_samples"] == TRAIN // 10 and math.isfinite(evals["eval_loss"]) and evals["eval_loss"] >= 0
    if shape == "regression":
        assert -1 <= evals["eval_pearson"] <= 1 and -1 <= evals["eval_spearmanr"] <= 1
        assert evals["eval_combined_score"] == pytest.approx((evals["eval_pearson"] + evals["eval_spearmanr"]) / 2)
    else:
        assert all(0 <= evals[f"eval_{m}"] <= 1 for m in EXPECTED_METRICS[shape])
    first = "pearson" if shape == "regression" else "accuracy"
    assert results[f"eval_{first}_per_rank"] == [results[f"eval_{first}"]] * results["world_size"]
    assert json.loads((out / "config.json").read_text())["problem_type"] == PROBLEM_TYPES[shape]
    lines = (out / "predict_results.txt").read_text().splitlines()
    assert lines[0] == "index\tprediction"
    assert [line.split("\t")[0] for line in lines[1:]] == [str(i) for i in range(TEST)]
    for line in lines[1:]:
        cell = line.split("\t")[1]
        if shape == "regression":
            assert math.isfinite(float(cell)) and cell == f"{float(cell):3.3f}"
        else:
            assert set(ast.literal_eval(cell)) <= set(TOPICS)


def parameter_differences(a: Path, b: Path) -> dict[str, float]:
    x, y = load_file(a), load_file(b)
    assert x.keys() == y.keys()
    return {k: (x[k].double() - y[k].double()).abs().max().item() for k in x}


@pytest.fixture(scope="module")
def baselines(tmp_path_factory, cache_dir) -> dict[str, tuple[Path, dict]]:
    """One process, batch 2B, per shape: what the 2-rank runs must reproduce."""
    root = tmp_path_factory.mktemp("shapes")
    found = {}
    for shape in SHAPES:
        out = root / f"single-{shape}"
        found[shape] = (out, train(root, out, cache_dir, shape, None, "single", 2 * B))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(SHAPES))
def test_task_shape_trains_the_same_under_two_ranks(shape, baselines, tmp_path, cache_dir):
    single_out, single = baselines[shape]
    check_outputs(single_out, shape, single)
    root = single_out.parent
    case, launcher, engine = CASES[shape]
    results = train(root, tmp_path / case, cache_dir, shape, launcher, engine, B)
    check_outputs(tmp_path / case, shape, results)
    differences = parameter_differences(single_out / "model.safetensors", tmp_path / case / "model.safetensors")
    name = max(differences, key=differences.get)
    print(f"{shape} {case} vs single: max-abs parameter difference {differences[name]:.3e} in {name}")
    assert differences[name] <= TOLERANCE
    assert results["eval_loss"] == pytest.approx(single["eval_loss"], abs=1e-4)
