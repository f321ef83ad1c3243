"""Exact evaluation metrics over the whole validation set, gathered from every rank (the task shape scores
them: horovod_train/tasks/); the training meter; the epoch sample audit."""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from horovod_train.common.errors import UsageError
from horovod_train.tasks.base import TaskShape

if TYPE_CHECKING:
    from horovod_train.engines.base import Engine


def exact_metrics(rows: torch.Tensor, losses: torch.Tensor, expected_examples: int, shape: TaskShape) -> dict[str, Any]:
    """``rows`` holds (example index, prediction(s), label(s)) and ``losses`` each example's loss, from all
    ranks. Each example must appear exactly once: the metrics are over the set (``shape.score``), not an
    average of per-rank metrics."""
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
    scores = shape.score(predictions, references)
    loss = float(losses.double().sum() / max(losses.numel(), 1))
    return {"loss": loss, **scores, "samples": int(index.numel())}


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
    grad_norm: torch.Tensor | None = None  # the last optimizer step's (the same on every rank), as HF logs it
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
        mask = batch.get("attention_mask")  # none in a padding-free batch (--padding_free): every token is real
        self.tokens = self.tokens + (mask.sum() if mask is not None else batch["input_ids"].numel())

    def step(self, grad_norm: torch.Tensor | None) -> None:
        """An optimizer step ended with ``grad_norm`` (left on the device: read when logged)."""
        self.grad_norm = grad_norm

    def reduce(self, engine: Engine, learning_rate: float | None = None) -> dict[str, float]:
        """Collective. Raises NonFiniteLoss on every rank if any rank's loss was NaN or infinite. ``grad_norm``
        where a step gave one."""
        loss_sum = tokens = first_bad = 0.0
        grad_norm: list[float] = []
        if self.loss_sum is not None:  # one copy to the host per log line
            held = [self.loss_sum, self.tokens, self.first_bad_step]
            held += [self.grad_norm.detach().float().to(self.loss_sum.device)] if self.grad_norm is not None else []
            loss_sum, tokens, first_bad, *grad_norm = torch.stack(held).tolist()
        sums = engine.all_reduce_sum(
            torch.tensor([loss_sum, self.micro_batches, self.samples, tokens], dtype=torch.float64)
        ).tolist()
        if not math.isfinite(sums[0]):  # the same sum on every rank: all take this branch
            steps = engine.all_gather(torch.tensor([first_bad], dtype=torch.float64, device=engine.device))
            raise NonFiniteLoss(min(int(s) for s in steps.cpu().tolist() if s > 0), sums[0], learning_rate)
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        norm = {"grad_norm": grad_norm[0]} if grad_norm else {}  # where a step gave one
        return {
            "loss": sums[0] / max(sums[1], 1),
            **norm,
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
