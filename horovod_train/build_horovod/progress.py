"""The long steps of a build said as they go: a line when one starts, a line a minute while it runs (pip's quiet
compile of several minutes must not look like a hang), and a line with its time when it is done."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from horovod_train.common.console import write_line

HEARTBEAT_S = 60.0


def duration(seconds: float) -> str:
    """``12.3 s``, ``4 min 05 s``, truncated as scripts/setup.sh writes its stages' times."""
    tenths = int(seconds * 10)
    if tenths < 600:
        return f"{tenths // 10}.{tenths % 10} s"
    return f"{tenths // 600} min {tenths // 10 % 60:02d} s"


@contextlib.contextmanager
def stage(what: str, heartbeat_s: float = HEARTBEAT_S) -> Iterator[None]:
    """``[horovod] <what> ...``, then ``[horovod] <what>: done in 4 min 05 s`` if the block succeeds."""
    started = time.monotonic()
    write_line(f"[horovod] {what} ...")
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat_s):
            write_line(f"[horovod] {what}: {duration(time.monotonic() - started)} so far")

    beating = threading.Thread(target=beat, name="build-horovod-progress", daemon=True)
    beating.start()
    try:
        yield
    finally:
        stop.set()
        beating.join()
    write_line(f"[horovod] {what}: done in {duration(time.monotonic() - started)}")
