"""One contender of bench gpu: an engine's model, optimizer and precision in one variant of the step, built and
stepped as `train` builds and steps them, and its timing windows."""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from torch._dynamo.utils import counters

from horovod_train.bench.architectures import model_config
from horovod_train.config.run_config import DataArguments, RunConfig, TrainingArguments
from horovod_train.engines.base import Engine
from horovod_train.training.amp import Precision
from horovod_train.training.step import accumulate_and_step

COMPILE_MODES = {"compiled": None, "cudagraphs": "reduce-overhead"}  # torch.compile's mode (None: its default)
# The batches of the variants not bucketed (batches.make_batches' pools).
POOLS = {"eager": "padded", "padding_free": "flattened"}


def flop_parameters(model: torch.nn.Module) -> int:
    """Parameters that take part in matmuls: all but the embeddings' (lookups), which 6 x N x tokens
    would count as 6 FLOPs per token each."""
    embedding = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if p.requires_grad and id(p) not in embedding)


class Contender:
    """One engine's model, optimizer and precision in one of the VARIANTS, built and stepped as `train` builds and
    steps them (training/build.py's finish_model and build_optimizer, the engine's prepare, training/step.py's
    accumulate_and_step); the graphs torch.compile made for it, its peak memory."""

    def __init__(self, engine: Engine, args: argparse.Namespace, training: TrainingArguments,
                 variant: str = "eager") -> None:  # fmt: skip
        from transformers import AutoModelForSequenceClassification

        from horovod_train.training.build import build_optimizer, finish_model

        self.engine, self.variant = engine, variant
        config = run_config(args, training, variant)
        torch.manual_seed(args.seed)  # a random init, as model.build_model makes tiny-bert's
        model = AutoModelForSequenceClassification.from_config(model_config(args.model), dtype=torch.float32)
        self.params = flop_parameters(model)
        self.graphs = 0
        self.peak_memory = 0
        self.taken = 0  # steps taken: the next window's batches follow on from the last one's, as in training
        # Its last window's losses summed, kept on the device (no host sync per step), and their count.
        self.loss_sum: torch.Tensor | None = None
        self.losses = 0
        self.training = config.training
        model = finish_model(model, config)
        self.model, self.optimizer = engine.prepare(model, lambda m: build_optimizer(self.training, engine, m))
        self.precision = Precision.from_args(self.training, engine.device)

    def train(self, batches: list[dict[str, torch.Tensor]]) -> None:
        """A window's steps, one per batch."""
        self.loss_sum, self.losses = None, 0
        for batch in batches:
            self.step(batch)

    def last_loss(self) -> float:
        """The mean loss of its last window (NaN before one)."""
        return self.loss_sum.item() / self.losses if self.loss_sum is not None else float("nan")

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        """One optimizer step of one micro-batch, moved to the device as the loop moves it."""
        on_device = {k: v.to(self.engine.device, non_blocking=True) for k, v in batch.items()}
        compiled_before = counters["stats"]["unique_graphs"]
        accumulate_and_step(self.engine, self.model, self.optimizer, self.precision, iter([on_device]), 1,
                            self.training.max_grad_norm, on_loss=self.keep_loss)  # fmt: skip
        self.graphs += counters["stats"]["unique_graphs"] - compiled_before

    def keep_loss(self, loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        self.losses += 1

    def close(self) -> None:
        """What it holds beside the engine's (nothing: see LoopContender)."""

    def pool(self, pools: dict[str, list[dict[str, torch.Tensor]]]) -> list[dict[str, torch.Tensor]]:
        """The variant's batches."""
        return pools[POOLS.get(self.variant, "bucketed")]


def run_config(args: argparse.Namespace, training: TrainingArguments, variant: str) -> RunConfig:
    """The arguments `train` would take a variant's step with: ``training``'s precision and clipping, compiled as
    the variant asks (else as --torch_compile does), and its batches' layout (eager's are padded per batch,
    padding_free's flattened (--padding_free), the others' padded to --length_buckets lengths: a compiled graph per
    bucket)."""
    compiled = variant in COMPILE_MODES or args.torch_compile
    training = dataclasses.replace(training, torch_compile=compiled, torch_compile_mode=COMPILE_MODES.get(variant),
                                   padding_free=variant == "padding_free")  # fmt: skip
    buckets = None if variant in POOLS else args.length_buckets  # bucketed, compiled, cudagraphs, loop
    return RunConfig(training=training, data=DataArguments(max_seq_length=args.max_seq_length, length_buckets=buckets))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def window(contender: Contender, pools: dict[str, list], steps: int) -> dict[str, float]:
    """``steps`` steps of ``contender`` on the batches that follow its last window's (its pool's, cyclically), timed
    from the device idle to the device idle."""
    device = contender.engine.device
    pool = contender.pool(pools)
    batches = [pool[(contender.taken + i) % len(pool)] for i in range(steps)]
    contender.taken += steps
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    contender.train(batches)
    synchronize(device)
    seconds = time.perf_counter() - started
    samples = sum(batch["labels"].shape[0] for batch in batches)
    # none in a padding-free batch: every token is real
    tokens = sum(int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel() for b in batches)
    padded = sum(batch["input_ids"].numel() for batch in batches)
    if device.type == "cuda":
        contender.peak_memory = max(contender.peak_memory, torch.cuda.max_memory_allocated(device))
    return {"seconds": seconds, "samples": samples, "tokens": tokens, "padded_tokens": padded, "steps": steps}


def setup_engine(name: str, training: TrainingArguments) -> Engine:
    from horovod_train.engines import create_engine

    engine = create_engine(RunConfig(training=dataclasses.replace(training, engine=name)))
    engine.setup()
    return engine
