"""Exact evaluation metrics over the whole validation set, gathered from every rank."""

from __future__ import annotations

import collections
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from horovod_train.errors import UsageError
from horovod_train.glue import REGRESSION_TASKS, task_metric_names

if TYPE_CHECKING:
    from horovod_train.engines.base import Engine

METRIC_MODULES = Path(__file__).parent / "evaluate_metrics"


@cache
def metric_module(name: str):
    import evaluate

    # Shipped with the package: evaluate.load("accuracy") would fetch the script from the hub.
    return evaluate.load(str(METRIC_MODULES / name), keep_in_memory=True)


SINGLE_LABEL = "single_label_classification"
REGRESSION = "regression"
MULTI_LABEL = "multi_label_classification"
PROBLEM_TYPES = (SINGLE_LABEL, REGRESSION, MULTI_LABEL)  # transformers' config.problem_type values


@dataclass(frozen=True)
class TaskShape:
    """What a model predicts and how it is scored: transformers' ``problem_type``, the label count, the GLUE
    task (run_glue's metrics) or None (a custom dataset), and the threshold of a multi-label prediction."""

    problem_type: str = SINGLE_LABEL
    num_labels: int = 2
    task_name: str | None = None
    threshold: float = 0.5

    @property
    def outputs(self) -> int:
        """Values per example in a prediction (and in a label): the multi-hot row, else one."""
        return self.num_labels if self.problem_type == MULTI_LABEL else 1

    def metric_names(self) -> tuple[str, ...]:
        """The evaluation metrics besides ``loss``, under run_glue's names for a GLUE task."""
        if self.problem_type == MULTI_LABEL:
            return ("accuracy", "f1_micro", "f1_macro")  # accuracy: subset accuracy (every label right)
        if self.task_name is not None and (self.problem_type == REGRESSION) == (self.task_name in REGRESSION_TASKS):
            return task_metric_names(self.task_name)
        return ("mse", "pearson", "spearmanr") if self.problem_type == REGRESSION else ("accuracy", "f1")


CLASSIFICATION = TaskShape()


def exact_metrics(
    rows: torch.Tensor, losses: torch.Tensor, expected_examples: int, shape: TaskShape = CLASSIFICATION
) -> dict[str, Any]:
    """``rows`` holds (example index, prediction(s), label(s)) and ``losses`` each example's loss, from all
    ranks. Each example must appear exactly once: the metrics are over the set, not an average of
    per-rank metrics. A custom dataset's F1 is macro-averaged over the classes."""
    index = rows[:, 0].long()
    if index.numel() != expected_examples or torch.unique(index).numel() != expected_examples:
        raise RuntimeError(
            f"evaluation gathered {index.numel()} predictions ({torch.unique(index).numel()} distinct) "
            f"for {expected_examples} examples"
        )
    ordered = rows[torch.argsort(index)]
    width = shape.outputs
    predictions, references = ordered[:, 1 : 1 + width].numpy(), ordered[:, 1 + width :].numpy()
    if width == 1:
        predictions, references = predictions[:, 0], references[:, 0]
    scores = score(shape, predictions, references)
    loss = float(losses.double().sum() / max(losses.numel(), 1))
    return {"loss": loss, **scores, "samples": int(index.numel())}


def score(shape: TaskShape, predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
    """``shape.metric_names()`` of predictions against references (in example order), by scikit-learn and
    scipy (transformers' run_glue computes them with the same functions through evaluate's glue metric)."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef, mean_squared_error

    functions: dict[str, Callable[[], float]] = {
        "accuracy": lambda: accuracy_score(references, predictions),  # subset accuracy for multi-hot rows
        "f1": lambda: f1_score(references, predictions),  # the positive class (label 1), as run_glue
        "matthews_correlation": lambda: matthews_corrcoef(references, predictions),
        "f1_micro": lambda: f1_score(references, predictions, average="micro", zero_division=0),
        "f1_macro": lambda: f1_score(references, predictions, average="macro", zero_division=0),
        "mse": lambda: mean_squared_error(references, predictions),
        "pearson": lambda: pearsonr(predictions, references)[0],
        "spearmanr": lambda: spearmanr(predictions, references)[0],
    }
    names = shape.metric_names()
    if shape.problem_type == SINGLE_LABEL and shape.task_name is None:  # as before: evaluate's shipped modules
        return custom_classification_scores(predictions.tolist(), references.tolist())
    with warnings.catch_warnings():  # constant predictions (early in training): the correlation is nan
        warnings.simplefilter("ignore")
        found = {name: float(functions[name]()) for name in names if name != "combined_score"}
    if "combined_score" in names:
        found["combined_score"] = float(np.mean(list(found.values())))
    return found


def custom_classification_scores(predictions: list, references: list) -> dict[str, float]:
    accuracy = metric_module("accuracy").compute(predictions=predictions, references=references)["accuracy"]
    f1 = metric_module("f1").compute(predictions=predictions, references=references, average="macro")["f1"]
    return {"accuracy": float(accuracy), "f1": float(f1)}


@dataclass
class Meter:
    """Training sums since the last log line, reduced over ranks when logged. The loss and token sums stay
    on the loss's device until then: reading them per micro-batch would make the host wait for the GPU
    every step (a host-device sync), where one copy per log line suffices."""

    loss_sum: torch.Tensor | None = None
    micro_batches: int = 0
    samples: int = 0
    tokens: torch.Tensor | None = None
    first_bad_step: torch.Tensor | None = None  # the first step with a non-finite loss, 0 for none
    started: float = field(default_factory=time.perf_counter)

    def add(self, loss: torch.Tensor, batch: dict[str, torch.Tensor], step: int = 0) -> None:
        """``loss``: the micro-batch's (detached) loss tensor; ``step``: the optimizer step it belongs to."""
        loss = loss.detach().float()
        if self.loss_sum is None:
            self.loss_sum = self.tokens = self.first_bad_step = torch.zeros((), device=loss.device)
        bad = ~torch.isfinite(loss) & (self.first_bad_step == 0)
        self.first_bad_step = torch.where(bad, float(step), self.first_bad_step)
        self.loss_sum = self.loss_sum + loss
        self.micro_batches += 1
        self.samples += batch["labels"].shape[0]
        self.tokens = self.tokens + batch["attention_mask"].sum()

    def reduce(self, engine: Engine, learning_rate: float | None = None) -> dict[str, float]:
        """Collective. Raises NonFiniteLoss on every rank if any rank's loss was NaN or infinite."""
        loss_sum = tokens = first_bad = 0.0
        if self.loss_sum is not None:  # one copy to the host per log line
            loss_sum, tokens, first_bad = torch.stack([self.loss_sum, self.tokens, self.first_bad_step]).tolist()
        sums = engine.all_reduce_sum(
            torch.tensor([loss_sum, self.micro_batches, self.samples, tokens], dtype=torch.float64)
        ).tolist()
        if not math.isfinite(sums[0]):  # the same sum on every rank: all take this branch
            steps = engine.all_gather(torch.tensor([first_bad], dtype=torch.float64, device=engine.device))
            raise NonFiniteLoss(min(int(s) for s in steps.cpu().tolist() if s > 0), sums[0], learning_rate)
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return {
            "loss": sums[0] / max(sums[1], 1),
            "samples_per_second": sums[2] / elapsed,
            "tokens_per_second": sums[3] / elapsed,
        }


class NonFiniteLoss(UsageError):
    """The training loss became NaN or infinite: the run stops (exit 2) instead of training on NaN."""

    def __init__(self, step: int, value: float, learning_rate: float | None) -> None:
        lr = f" (this run: {learning_rate:g})" if learning_rate is not None else ""
        super().__init__(
            f"the training loss became {value} at step {step}",
            f"lower --learning_rate{lr}, or set --max_grad_norm; "
            "resume from a checkpoint saved before that step (--resume_from_checkpoint)",
        )
        self.args = (step, value, learning_rate)  # pickles (broadcast between ranks) like its parent
        self.step = step


def audit_epoch(examples: list[int], dataset_size: int) -> dict[str, int]:
    """How an epoch covered the training set: examples never seen and extra repetitions."""
    counts = collections.Counter(examples)
    return {
        "dataset": dataset_size,
        "trained_on": len(examples),
        "skipped": dataset_size - len(counts),
        "repeated": sum(n - 1 for n in counts.values()),
    }
