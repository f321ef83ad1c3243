"""One rank of `bench trace`: `bench trace` launches `horovod-train train ARGS...` with TRACE_DIR_VARIABLE
(bench/runs/__init__.py) naming its trace directory, and the command line, seeing it, runs the command inside
``recording``: the step's parts are recorded (horovod_train/training/phases.py: wall-clock spans on the main
thread, a few per step) and this rank's per-step breakdown, in milliseconds, is written to
``TRACE_DIR/rank<R>.steps.json``:
  forward        the forward pass and the loss;
  backward       the backward pass, with its gradient hooks and DDP's wait for its last buckets;
  gradient_wait  Horovod's wait for its gradient all-reduces before the optimizer step;
  optimizer      clip, step and zero_grad, the wait excluded;
  other          the step's remainder (the next batch, the loss meter).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from horovod_train.launching import environment
from horovod_train.training import phases

PARTS = ("forward", "backward", "gradient_wait", "optimizer")


def union_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of (start, end) intervals in microseconds, in milliseconds."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1000


def clipped(intervals: list[tuple[float, float]], start: float, stop: float) -> list[tuple[float, float]]:
    return [(max(a, start), min(b, stop)) for a, b in intervals if b > start and a < stop]


def step_breakdown(spans: list[tuple[str, float, float]]) -> list[dict[str, float]]:
    """Per optimizer step, milliseconds per part, from (name, start, end) spans in seconds."""
    by_name: dict[str, list[tuple[float, float]]] = {}
    for name, start, end in spans:
        by_name.setdefault(name, []).append((start * 1e6, end * 1e6))
    rows = []
    for s, t in sorted(by_name.get(phases.STEP, [])):
        part = {
            name: union_ms(clipped(by_name.get(name, []), s, t))
            for name in (phases.FORWARD, phases.BACKWARD, phases.OPTIMIZER, phases.GRADIENT_WAIT)
        }
        row = {
            "step": (t - s) / 1000,
            "forward": part[phases.FORWARD],
            "backward": part[phases.BACKWARD],
            "gradient_wait": part[phases.GRADIENT_WAIT],
            "optimizer": part[phases.OPTIMIZER] - part[phases.GRADIENT_WAIT],
        }
        row["other"] = row["step"] - sum(row[k] for k in PARTS)
        rows.append(row)
    return rows


@contextmanager
def recording(trace_dir: Path) -> Iterator[None]:
    """The steps of what runs inside recorded; once it returns (not when it raises: a refused command wrote no
    steps), their parts written to ``trace_dir``/rank<R>.steps.json."""
    rank = environment.detect(resolve_master=False).rank
    spans = phases.record()
    yield
    trace_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"rank": rank, "steps": step_breakdown(spans)}
    (trace_dir / f"rank{rank}.steps.json").write_text(json.dumps(result, indent=1) + "\n")
