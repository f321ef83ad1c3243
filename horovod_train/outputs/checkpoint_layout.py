"""A checkpoint's names in a run directory, for the run directory (which judges them, without torch) and for
``checkpoint`` (which writes and reads what a checkpoint holds)."""

from __future__ import annotations

import re

PREFIX = "checkpoint-"
MANIFEST = "manifest.json"
TRAINER_FILE = "trainer_state.json"  # transformers' name: a checkpoint's, and a finished run's at its top level
NAME = re.compile(rf"{PREFIX}(\d+)")
STALE = re.compile(rf"\.{PREFIX}\d+\..*\.tmp|\.{PREFIX}\d+\.previous")
AUTO, LATEST = "auto", "latest"
