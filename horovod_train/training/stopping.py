"""Stop on a scheduler's signal with a checkpoint, instead of losing the work since the last one.

SLURM sends SIGTERM at a time limit, on preemption and on ``scancel`` (after the warning signal that
``#SBATCH --signal`` asks for: SIGUSR1 in launch/slurm/); torchrun passes SIGTERM on to its workers.
The handler only records the signal. The ranks agree through one small all-reduce per step (a rank
that got no signal stops with the others), overlapped with the following step; at the step boundary
after that, rank 0 writes a checkpoint and every rank exits with STOPPED_EXIT_CODE. Later signals are
ignored while stopping; SIGKILL still ends the process, and then the previous checkpoint is the valid
one (checkpoints are written atomically).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol


class Collectives(Protocol):  # what this needs of an engine (config imports this module: no engine import)
    def all_reduce_sum_async(self, tensor: Any) -> Callable[[], Any]: ...


STOPPED_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): stopped early, a checkpoint saved; run again to continue
_WATCHED: set[signal.Signals] = set()  # the stop signals this process handles now (its StopSignals)


def _ignore_in_forked_child() -> None:
    """A forked child (a DataLoader or tokenizer worker) ignores the stop signals instead of inheriting the
    handler: it is not a rank, and launch/ranks.sh takes a Python process that catches SIGUSR1 for one (its rank,
    their parent, would be left out as a launcher). Ignored, not default: a signal to the whole process group
    (Ctrl-C, a scheduler's) must not kill a worker while its rank checkpoints."""
    for sig in _WATCHED:
        signal.signal(sig, signal.SIG_IGN)


os.register_at_fork(after_in_child=_ignore_in_forked_child)


class TrainingStopped(Exception):
    """Raised on every rank once the ranks agreed to stop and the checkpoint is written."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def parse_signals(spec: str) -> list[signal.Signals]:
    """'SIGTERM,SIGUSR1' (or 'TERM,USR1'; 'none' for no handler) -> the signals. ValueError if unknown."""
    names = [name.strip().upper() for name in spec.split(",") if name.strip()]
    if names in ([], ["NONE"]):
        return []
    return [signal.Signals[name if name.startswith("SIG") else f"SIG{name}"] for name in names]


class StopSignals:
    """The stop signals of one process, and the ranks' agreement on them, one step behind: the flags'
    all-reduce started at a step boundary runs during the next step and is read at the next boundary,
    so it costs no waiting (a stop comes one step later; that step is in the checkpoint)."""

    def __init__(self, signals: list[signal.Signals]) -> None:
        self.received: str | None = None
        self.agreed: str | None = None  # the signal the ranks stopped on, whichever rank received it
        self.previous = {sig: signal.signal(sig, self._record) for sig in signals}
        _WATCHED.update(signals)
        self.pending: Callable[[], Any] | None = None

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name

    def poll(self, engine: Collectives) -> str | None:
        """Collective, at every step boundary: the signal a rank had received by the previous boundary."""
        import torch

        watched = list(self.previous)
        if not watched:
            return None
        agreed = self.wait()
        if agreed is None:
            flags = torch.tensor([float(sig.name == self.received) for sig in watched], dtype=torch.float64)
            self.pending = engine.all_reduce_sum_async(flags)
        return agreed

    def wait(self) -> str | None:
        """Finish the all-reduce in flight, if any (before a collective-free stretch: the end of the run)."""
        if self.pending is None:
            return None
        counts, self.pending = self.pending().tolist(), None
        received = [sig.name for sig, count in zip(self.previous, counts, strict=True) if count > 0]
        if received:
            self.agreed = received[0]
        return received[0] if received else None

    def forget(self) -> None:
        """Drop the all-reduce in flight: a resized world (elastic) never completes it."""
        self.pending = None

    def close(self) -> None:
        """Give the signals back; after a stop, ignore them until the process exits: the batch shell
        signals every rank, and a rank that already stopped with the others (often on another rank's
        signal, its own still on the way) must not die of a late one (SIGUSR1's default action ends the
        process, its last lines unflushed, and the launcher reports a failure)."""
        stopped = self.received or self.agreed
        for sig, handler in self.previous.items():
            signal.signal(sig, signal.SIG_IGN if stopped else handler)
        _WATCHED.difference_update(self.previous)
