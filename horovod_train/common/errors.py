"""User-facing errors: one line naming the problem and the fix, exit code 2, printed once per job."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from typing import NoReturn

from horovod_train.common.console import write_line

USAGE_EXIT_CODE = 2
# How long a rank other than 0 keeps its error to itself. Every rank of a job meets the same bad input (the same
# arguments; rank 0's reads are broadcast), and rank 0 says it: every launcher then ends the other ranks (its
# SIGTERM ends their wait here). One still running after this met an error rank 0 did not (a GPU missing on its
# node), and says it itself. Long enough for a loaded machine's import-time skew between ranks.
QUIET_RANK_WAIT_S = 20.0


class UsageError(Exception):
    """Bad input from the user. Raised before anything is written."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem, fix)  # both in args, so the error pickles (it is broadcast between ranks)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.problem}; fix: {self.fix}"


def wait_for_rank_0_to_end_the_job() -> None:
    """Sleep as a job's non-zero rank while rank 0 reports the error, until the launcher's SIGTERM ends it: then
    exit 2 like rank 0 (a rank killed by the signal would add a line: horovodrun's shell prints `Terminated`)."""
    with contextlib.suppress(ValueError):  # not the main thread: the handlers stay as they are
        signal.signal(signal.SIGTERM, _exit_on_signal)
    time.sleep(QUIET_RANK_WAIT_S)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(USAGE_EXIT_CODE)


def exit_with(error: UsageError, rank: int = 0) -> NoReturn:
    """``error: PROBLEM; fix: FIX`` on stderr and exit 2, without a traceback; ``rank``: this process's rank in its
    job (the launcher's), so that rank 0 alone says it."""
    if rank != 0:
        wait_for_rank_0_to_end_the_job()
    write_line(f"error: {error}", sys.stderr)
    raise SystemExit(USAGE_EXIT_CODE)
