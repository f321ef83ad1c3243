"""Find a rank's process by its output directory and rank variable; wait for a condition; wait beside a hung rank."""

from __future__ import annotations

import time
from collections.abc import Callable
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


def wait_beside_a_hung_rank(rank_main: Callable[[int, str, str], None], world: int, waiting: int, hung: int,
                            tmp_path: Path) -> tuple[float, str]:  # fmt: skip
    """``world`` real ranks forked from this process (torch is imported already: seconds, not a start per rank),
    each ``rank_main(rank, store, report)``: rank ``hung`` stays alive and silent, as a stopped node, and rank
    ``waiting`` writes "<seconds waited> <outcome>" to ``report`` once its collective gave up (or completed). Its
    (seconds, outcome); every rank killed after."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    report = tmp_path / f"rank-{waiting}"
    ranks = [context.Process(target=rank_main, args=(r, str(tmp_path / "store"), str(report))) for r in range(world)]
    for process in ranks:
        process.start()
    try:
        ranks[waiting].join(timeout=30)
        assert report.exists(), f"rank {waiting} still waits for the hung rank {hung}"
        waited, outcome = report.read_text().split(" ", 1)
        return float(waited), outcome
    finally:
        for process in ranks:
            process.kill()
            process.join()
