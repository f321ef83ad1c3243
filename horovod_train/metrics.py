"""Exact evaluation metrics over the whole validation set, gathered from every rank."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import torch

ACCURACY_MODULE = Path(__file__).parent / "evaluate_metrics" / "accuracy"


@cache
def accuracy_metric():
    import evaluate

    # Shipped with the package: evaluate.load("accuracy") would fetch the script from the hub.
    return evaluate.load(str(ACCURACY_MODULE), keep_in_memory=True)


def exact_accuracy(rows: torch.Tensor, expected_examples: int) -> dict[str, Any]:
    """``rows`` holds (example index, prediction, label) from all ranks. Each example must appear
    exactly once: the result is the accuracy over the set, not an average of per-rank accuracies."""
    index = rows[:, 0]
    if index.numel() != expected_examples or torch.unique(index).numel() != expected_examples:
        raise RuntimeError(
            f"evaluation gathered {index.numel()} predictions ({torch.unique(index).numel()} distinct) "
            f"for {expected_examples} validation examples"
        )
    ordered = rows[torch.argsort(index)]
    score = accuracy_metric().compute(predictions=ordered[:, 1].tolist(), references=ordered[:, 2].tolist())
    return {"accuracy": float(score["accuracy"]), "eval_samples": int(index.numel())}
