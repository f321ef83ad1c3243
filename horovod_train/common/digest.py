"""SHA-256 of a file, read in blocks (checkpoint manifests, the Horovod wheel cache). Standard library alone:
build-horovod imports it before the package's dependencies exist."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
