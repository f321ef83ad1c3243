"""The files transformers' tools read at the end of a run: ``all_results.json``, ``train_results.json``,
``eval_results.json``, ``trainer_state.json`` (with ``log_history``) and run_glue's ``predict_results*.txt``.

``all_results.json`` also carries the run's own record (engine, world size, per-rank checksums, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from horovod_train.files import atomic_file, write_json_atomic
from horovod_train.tasks.base import TaskShape


def write_results(output_dir: Path, results: dict[str, Any], train_metrics: dict[str, Any], state: dict) -> None:
    epoch = {"epoch": state["epoch"]}
    evals = {k: v for k, v in results.items() if k.startswith("eval_") and not k.endswith("_per_rank")}
    write_json_atomic(output_dir / "train_results.json", {**train_metrics, **epoch})
    write_json_atomic(output_dir / "eval_results.json", {**evals, **epoch})
    write_json_atomic(output_dir / "trainer_state.json", state)
    write_json_atomic(output_dir / "all_results.json", {**results, **epoch})  # last: it marks a finished run


def write_predictions(
    output_dir: Path, predictions: dict[str, list], id2label: dict[int, str], shape: TaskShape
) -> None:
    """run_glue's format: a header ``index\\tprediction``, then one line per example, its prediction as the
    task's shape writes it (``shape.shown``: run_glue's and run_classification's cells)."""
    for split, labels in predictions.items():
        suffix = "" if split == "test" else f"_{split.removeprefix('test_')}"
        lines = ["index\tprediction", *(f"{i}\t{shape.shown(label, id2label)}" for i, label in enumerate(labels))]
        with atomic_file(output_dir / f"predict_results{suffix}.txt") as f:
            f.write("\n".join(lines) + "\n")
