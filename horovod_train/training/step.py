"""One optimizer step, the one code that takes it: the training loop calls it for every step, and `bench gpu`
times it, so a measured throughput is the loop's own. It imports neither the data nor the loop's other parts
(a benchmark brings its own batches).

--auto_find_batch_size: the largest per-device batch whose step fits the GPU's memory, halving from the one
given, with the gradient accumulation doubled at each halving so that the global batch (and so the results)
does not depend on the GPU's size. "Fits": a forward and backward pass of the longest batch the run can see
(--max_seq_length tokens per example) raises no torch.cuda.OutOfMemoryError while the optimizer's state
(AdamW: two float32 values per trainable parameter) is held beside it. The CPU has no such limit to probe: a
run there keeps the batch it was given, and says so."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch import nn

from horovod_train.common.errors import UsageError
from horovod_train.config.run_config import TrainingArguments
from horovod_train.engines.base import Engine
from horovod_train.training import phases
from horovod_train.training.amp import Precision

Batch = dict[str, torch.Tensor]


class Step(NamedTuple):
    examples: int  # this rank trained on
    grad_norm: torch.Tensor | None  # the whole gradient's before clipping, on the device (Engine.clip_and_step)


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
) -> Step:
    """Forward and backward over ``accumulation_steps`` micro-batches (on the engine's device; the engine's
    all-reduce deferred to the last), then clip and step. ``on_loss`` gets each micro-batch's detached loss
    (the loop's meter: no host sync). The labelled ranges are what `bench trace` splits a step into (profiler
    ranges: a few µs per step)."""
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
            grad_norm = engine.clip_and_step(model, optimizer, max_grad_norm, precision.scaler)
            optimizer.zero_grad()
    return Step(examples, grad_norm)


def halve_until_fits(try_batch: Callable[[int], None], batch: int, accumulation: int) -> tuple[int, int]:
    """(batch, accumulation): the first of ``batch``, ``batch``/2, ... for which ``try_batch`` raises no CUDA
    out-of-memory error, and ``accumulation`` multiplied as ``batch`` was divided (their product kept)."""
    while True:
        try:
            try_batch(batch)
            return batch, accumulation
        except torch.cuda.OutOfMemoryError:
            if batch % 2:
                fix = "pass a smaller --per_device_train_batch_size (a power of two halves furthest)"
                raise UsageError(f"--auto_find_batch_size: a step of {batch} examples does not fit, and {batch} "
                                 "cannot be halved keeping the global batch", fix) from None  # fmt: skip
            batch, accumulation = batch // 2, accumulation * 2
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the failed try's blocks, back for the next


def fit_batch_size(
    args: TrainingArguments, engine: Engine, model: nn.Module, max_seq_length: int, log: Callable[[str], None]
) -> None:
    """--auto_find_batch_size: set ``args``'s batch and accumulation to what fits (in place: the engine reads
    the accumulation from the same arguments), the same on every rank (the smallest any rank found).
    Collective; before the engine wraps the model, so that a try takes part in no collective."""
    batch, accumulation = args.per_device_train_batch_size, args.gradient_accumulation_steps
    if engine.device.type != "cuda" or engine.builds_model_on_meta:
        where = "the CPU" if engine.device.type != "cuda" else f"--engine {engine.name} (its model is built sharded)"
        log(f"--auto_find_batch_size: no memory to probe on {where}; --per_device_train_batch_size {batch} as given")
        return
    precision = Precision.from_args(args, engine.device)
    found, _ = halve_until_fits(lambda n: try_step(model, engine.device, precision, n, max_seq_length), batch, 1)
    smallest = int(engine.all_gather(torch.tensor([found], device=engine.device)).min())
    args.per_device_train_batch_size = smallest
    args.gradient_accumulation_steps = accumulation * (batch // smallest)
    log(f"--auto_find_batch_size: --per_device_train_batch_size {smallest} --gradient_accumulation_steps "
        f"{args.gradient_accumulation_steps} (global batch kept)")  # fmt: skip


def try_step(model: nn.Module, device: torch.device, precision: Precision, batch: int, length: int) -> None:
    """A forward and backward pass of ``batch`` examples of ``length`` tokens, the optimizer's state held beside;
    on its own random numbers (dropout), so that the run's are as without the try."""
    model.to(device)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    config = model.config
    if config.problem_type == "multi_label_classification":
        labels = torch.zeros(batch, config.num_labels, device=device)
    elif config.problem_type == "regression":
        labels = torch.zeros(batch, device=device)
    else:
        labels = torch.zeros(batch, dtype=torch.long, device=device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        ids = torch.randint(0, model.get_input_embeddings().num_embeddings, (batch, length), device=device)
        optimizer_state = torch.empty(2 * trainable, dtype=torch.float32, device=device)  # noqa: F841 (held)
        try:
            model.train()
            with precision.autocast():
                loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
            loss.backward()
        finally:
            model.zero_grad(set_to_none=True)
