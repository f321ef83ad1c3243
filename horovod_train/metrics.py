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

METRIC_MODULES = Path(__file__).parent / "evaluate_metrics"


@cache
def metric_module(name: str):
    import evaluate

    # Shipped with the package: evaluate.load("accuracy") would fetch the script from the hub.
    return evaluate.load(str(METRIC_MODULES / name), keep_in_memory=True)


def exact_metrics(rows: torch.Tensor, losses: torch.Tensor, expected_examples: int) -> dict[str, Any]:
    """``rows`` holds (example index, prediction, label) and ``losses`` each example's loss, from all
    ranks. Each example must appear exactly once: the metrics are over the set, not an average of
    per-rank metrics. F1 is macro-averaged over the classes."""
    index = rows[:, 0]
    if index.numel() != expected_examples or torch.unique(index).numel() != expected_examples:
        raise RuntimeError(
            f"evaluation gathered {index.numel()} predictions ({torch.unique(index).numel()} distinct) "
            f"for {expected_examples} examples"
        )
    order = torch.argsort(index)
    predictions, references = rows[order, 1].tolist(), rows[order, 2].tolist()
    accuracy = metric_module("accuracy").compute(predictions=predictions, references=references)["accuracy"]
    f1 = metric_module("f1").compute(predictions=predictions, references=references, average="macro")["f1"]
    loss = float(losses.double().sum() / max(losses.numel(), 1))
    return {"loss": loss, "accuracy": float(accuracy), "f1": float(f1), "samples": int(index.numel())}


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
