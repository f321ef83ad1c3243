"""One optimizer step, the one code that takes it: the training loop calls it for every step, and `bench gpu`
times it, so a measured throughput is the loop's own. It imports neither the data nor the loop's other parts
(a benchmark brings its own batches)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from horovod_train.amp import Precision
from horovod_train.engines.base import Engine
from horovod_train.training import phases

Batch = dict[str, torch.Tensor]


def accumulate_and_step(
    engine: Engine,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    micro_batches: Iterator[Batch],
    accumulation_steps: int,
    max_grad_norm: float,
    label_smoothing: float = 0.0,
    on_loss: Callable[[torch.Tensor, Batch], None] | None = None,
) -> int:
    """Forward and backward over ``accumulation_steps`` micro-batches (on the engine's device; the engine's
    all-reduce deferred to the last), then clip and step; returns the examples this rank trained on.
    ``on_loss`` gets each micro-batch's detached loss (the loop's meter: no host sync). The labelled ranges
    are what `bench trace` splits a step into (profiler ranges: a few µs per step)."""
    examples = 0
    with phases.span(phases.STEP):
        for micro in range(accumulation_steps):
            batch = next(micro_batches)
            examples += len(batch["labels"])
            with engine.accumulation_context(model, is_last_micro_step=micro == accumulation_steps - 1):
                with phases.span(phases.FORWARD), precision.autocast():
                    loss = engine.forward_loss(model, batch, label_smoothing)
                with phases.span(phases.BACKWARD):
                    precision.backward(loss / accumulation_steps)
            if on_loss is not None:
                on_loss(loss.detach(), batch)
        with phases.span(phases.OPTIMIZER):
            engine.clip_and_step(model, optimizer, max_grad_norm, precision.scaler)
            optimizer.zero_grad()
    return examples
