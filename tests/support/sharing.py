"""Pytest processes sharing the integration tier, module by module (scripts/test.sh, issue 40): three, each after a
tier of its own (tests/unit, nothing, tests/system), so that the one whose own tier ends first fills its core with
integration modules. Its tests are about one core each (two ranks that mostly take turns, imports, waits). With
``HVT_SHARE_DIR`` set, a process runs a shared module's tests only if it claimed the module first (a file created
with O_EXCL in that directory, which every process sees); the others pass them over without a report, so the runs'
reports add up to the tier once. A module is claimed whole, when its first test is reached: its module-scoped
launches stay in one process. Each process collects everything and walks the modules longest first (the seconds
each took in a recent run, ``module_seconds.json``; one not listed counts as the median), so that the modules left
for the end are short and the processes end close together: in a random order, a 6-minute module taken last kept
one process running minutes after the others, on one core of two. Ties keep pytest-randomly's order, and the tests
inside a module keep theirs. The claims keep the work dynamic (a slow module never holds another process up).
Without ``HVT_SHARE_DIR`` nothing changes. Refresh the file from a kept clock (``HVT_CLOCK_KEEP=DIR make test``):
``python scripts/clock_report.py --module-seconds DIR > tests/support/module_seconds.json``.

A process's own tier runs before the shared modules (tests/conftest.py orders them), so that passing a module over
never leaves a fixture of another directory set up (pytest tears down what the next item does not need only at the
end of an item it ran).

"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from pathlib import Path

import pytest

SHARED_TIER = "tests/integration/"
SHARE_DIR = os.environ.get("HVT_SHARE_DIR")
# Whether this process starts the session's background builds at collection (support/builds.py): the first
# process does; the second builds only what a module it claimed waits for.
EARLY_BUILDS = os.environ.get("HVT_EARLY_BUILDS", "1") == "1"


# The shared tier's modules: the seconds each took in a recent run, its tests' sum (scripts/clock_report.py writes it).
MODULE_SECONDS: dict[str, float] = json.loads((Path(__file__).parent / "module_seconds.json").read_text())
MEDIAN_SECONDS = statistics.median(MODULE_SECONDS.values())


def shared(item: pytest.Item) -> bool:
    return SHARE_DIR is not None and item.nodeid.startswith(SHARED_TIER)


def longest_first(item: pytest.Item) -> float:
    """A sort key: a shared module's expected seconds, negated (0 for the others: their order is their own)."""
    return -MODULE_SECONDS.get(item.nodeid.split("::")[0], MEDIAN_SECONDS) if shared(item) else 0.0


class Claims:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.mine: dict[str, bool] = {}

    def runs_here(self, module: str) -> bool:
        if module not in self.mine:
            path = self.folder / hashlib.sha256(module.encode()).hexdigest()[:32]
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                self.mine[module] = True
            except FileExistsError:
                self.mine[module] = False
        return self.mine[module]


CLAIMS = Claims(Path(SHARE_DIR)) if SHARE_DIR else None


def passed_over(item: pytest.Item) -> bool:
    """Whether the other process claimed ``item``'s module, and runs it (tests/conftest.py's protocol hook)."""
    return CLAIMS is not None and shared(item) and not CLAIMS.runs_here(item.nodeid.split("::")[0])
