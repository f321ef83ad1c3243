"""The parts every optimizer step is split into, marked by the training loop and the engines: as
torch.profiler ranges (free when no profiler runs) and, once ``record()`` was called, as wall-clock spans
on this process's main thread, which `bench trace` reads (a profiler's per-operation cost would distort
the very split it measures)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from torch.profiler import record_function

STEP = "horovod_train.step"  # one optimizer step: its micro-batches, the gradient step, zero_grad
FORWARD = "horovod_train.forward"
BACKWARD = "horovod_train.backward"  # autograd, plus DDP's final wait for its bucket all-reduces
OPTIMIZER = "horovod_train.optimizer_step"  # clip and step (Horovod: its wait for the all-reduces first)
GRADIENT_WAIT = "horovod_train.gradient_wait"  # inside OPTIMIZER: Horovod waiting for its gradient all-reduces

_spans: list[tuple[str, float, float]] | None = None


def record() -> list[tuple[str, float, float]]:
    """From now on every span is appended, as (name, start, end) in seconds, to the list returned."""
    global _spans
    _spans = []
    return _spans


@contextmanager
def span(name: str) -> Iterator[None]:
    with record_function(name):
        if _spans is None:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            _spans.append((name, start, time.perf_counter()))
