"""The package as users install it into an environment they already have: sdist and wheel build, the wheel
installs with its declared dependencies next to a torch that is already there (as a cluster module or a
container provides it) and leaves that torch alone, and the console script runs without Horovod (doctor says
how to build it). One version, written in pyproject.toml alone."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_version_is_written_in_pyproject_alone() -> None:
    ours = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)[1]
    # Our version as a literal anywhere (other packages' versions, e.g. Horovod's 0.28.1, are theirs to pin).
    literal = re.compile(rf"""__version__\s*=\s*["']|["']{re.escape(ours)}["']""")
    copies = [str(p) for p in (REPO / "horovod_train").rglob("*.py") if literal.search(p.read_text())]
    assert copies == [], f"a version written outside pyproject.toml: {copies}"
