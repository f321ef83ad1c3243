"""Find a rank's process by its output directory and rank variable; wait for a condition."""

from __future__ import annotations

import time
from pathlib import Path


def find_rank_process(output_dir: Path, rank_variable: str, rank: int | str) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"horovod_train" in cmdline
            and str(output_dir).encode() in cmdline
            and cmdline[0].endswith(b"python")
            and f"{rank_variable}={rank}".encode() in environ
        ):
            return int(entry.name)
    return None


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
