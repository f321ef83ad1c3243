"""Rank 0's log lines, written above the progress bar when there is one."""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm.auto import tqdm

from horovod_train.common.console import write_line
from horovod_train.engines.base import Engine


class Console:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.show_bar = False
        self.bar = tqdm(total=0, disable=True)  # start_bar() draws one on rank 0 at a terminal

    def start_bar(self, total_steps: int, wanted: bool) -> None:
        """Under a launcher stderr is a pipe, not a terminal: no bar (its redraws garble tagged lines), a log
        line per --logging_steps instead."""
        self.show_bar = self.engine.is_main and sys.stderr.isatty() and wanted
        self.bar = tqdm(total=total_steps, disable=not self.show_bar, desc="train")

    def log(self, message: str, file: TextIO | None = None) -> None:
        """Rank 0 only."""
        if not self.engine.is_main:
            return
        if self.show_bar:
            tqdm.write(message, file=file)
        else:
            write_line(message, file)

    def warn(self, message: str) -> None:
        self.log(message, sys.stderr)
