"""The Dockerfile and entry point as the static and build tests read them."""

from __future__ import annotations

import re
from pathlib import Path

from support.jobs import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"

SHARED_SCRIPTS = ["scripts/install_mpi.sh", "scripts/build_horovod.sh", "scripts/check_horovod_build.sh"]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result
