"""Exact evaluation metrics over the whole validation set, gathered from every rank."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from horovod_train.engines.base import Engine

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


@dataclass
class Meter:
    """Training sums since the last log line, reduced over ranks when logged."""

    loss_sum: float = 0.0
    micro_batches: int = 0
    samples: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.perf_counter)

    def add(self, loss: float, batch: dict[str, torch.Tensor]) -> None:
        self.loss_sum += loss
        self.micro_batches += 1
        self.samples += batch["labels"].shape[0]
        self.tokens += int(batch["attention_mask"].sum())

    def reduce(self, engine: Engine) -> dict[str, float]:
        sums = engine.all_reduce_sum(
            torch.tensor([self.loss_sum, self.micro_batches, self.samples, self.tokens], dtype=torch.float64)
        ).tolist()
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return {
            "loss": sums[0] / max(sums[1], 1),
            "samples_per_second": sums[2] / elapsed,
            "tokens_per_second": sums[3] / elapsed,
        }


def audit_epoch(examples: list[int], dataset_size: int) -> dict[str, int]:
    """How an epoch covered the training set: examples never seen and extra repetitions."""
    counts = collections.Counter(examples)
    return {
        "dataset": dataset_size,
        "trained_on": len(examples),
        "skipped": dataset_size - len(counts),
        "repeated": sum(n - 1 for n in counts.values()),
    }
