"""The Horovod wheels a GPU check built, kept so that a later run installs them instead of building (minutes):
packed with their SHA256SUMS (one folder per build key, as build_horovod caches them) into one tar, split into
parts small enough to come back from a lent machine (16 MiB a file there), and restored into the wheel cache
from a folder holding the parts (the carried bundle). build_horovod then finds them as cached wheels and checks
their digest before installing. Standard library only."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path

PART_PREFIX = "horovod-wheels.tar."
PART_BYTES = 15 * 2**20  # under the 16 MiB a lent machine sends back per file


def new_builds(cache: Path, since: float) -> list[Path]:
    """The build-key folders of ``cache`` whose wheel was written at or after ``since`` (a time.time())."""
    if not cache.is_dir():
        return []
    return sorted(
        folder
        for folder in cache.iterdir()
        if any(wheel.stat().st_mtime >= since for wheel in folder.glob("horovod-*.whl"))
    )


def keep(folders: Iterable[Path], out: Path) -> list[Path]:
    """``folders`` (wheel + SHA256SUMS each) as one tar in parts ``out``/horovod-wheels.tar.NN; the parts written.
    Parts of an earlier run in ``out`` are replaced."""
    for old in out.glob(PART_PREFIX + "*"):
        old.unlink()
    folders = list(folders)
    if not folders:
        return []
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        for folder in folders:
            for path in sorted(folder.iterdir()):
                tar.add(path, arcname=f"{folder.name}/{path.name}")
    data = packed.getvalue()
    parts = []
    for index, start in enumerate(range(0, len(data), PART_BYTES)):
        part = out / f"{PART_PREFIX}{index:02d}"
        part.write_bytes(data[start : start + PART_BYTES])
        parts.append(part)
    return parts


def restore(source: Path, cache: Path) -> list[str]:
    """Join the parts in ``source`` (if any) and unpack their build-key folders into ``cache``; the keys restored.
    A folder already in the cache is left as it is (it may be a newer build)."""
    parts = sorted(source.glob(PART_PREFIX + "*")) if source.is_dir() else []
    if not parts:
        return []
    data = b"".join(part.read_bytes() for part in parts)
    restored = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and len(Path(m.name).parts) == 2]
        for key in sorted({Path(m.name).parts[0] for m in members}):
            if (cache / key).is_dir():
                continue
            staging = cache / f".{key}.restoring-{time.time_ns()}"
            staging.mkdir(parents=True)
            for member in (m for m in members if Path(m.name).parts[0] == key):
                (staging / Path(member.name).name).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
            staging.rename(cache / key)  # whole or not at all, as build_horovod stores a wheel
            restored.append(key)
    return restored
