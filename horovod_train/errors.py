"""User-facing errors: one line naming the problem and the fix, exit code 2."""

from __future__ import annotations

import sys

from horovod_train.console import write_line

USAGE_EXIT_CODE = 2


class UsageError(Exception):
    """Bad input from the user. Raised before anything is written."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem, fix)  # both in args, so the error pickles (it is broadcast between ranks)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.problem}; fix: {self.fix}"


def exit_with(error: UsageError) -> None:
    write_line(f"error: {error}", sys.stderr)
    raise SystemExit(USAGE_EXIT_CODE)
