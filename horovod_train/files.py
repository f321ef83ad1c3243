"""Files written so that a crash never leaves a half-written one behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from horovod_train.errors import UsageError


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory and rename it to ``target`` when the block succeeds.
    If ``target`` appeared meanwhile (another writer won), the temporary copy is discarded."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        yield tmp
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_output_dir(output_dir: str, overwrite: bool) -> None:
    """Refuse, before anything is written, an output directory that cannot or must not be used."""
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--output_dir {output_dir} is a file", "pass a directory path")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise UsageError(
            f"--output_dir {output_dir} already holds files of an earlier run",
            "pass --overwrite_output_dir to replace them, or choose another --output_dir",
        )
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--output_dir {output_dir} lies inside the file {existing}", "choose a directory path")
    try:  # a real probe: root passes os.access() checks on read-only mounts
        tempfile.TemporaryFile(dir=existing).close()
    except OSError:
        raise UsageError(f"--output_dir {output_dir} is not writable", "choose a directory you can write to") from None


def reset_output_dir(output_dir: str) -> Path:
    """Empty the output directory (only called after every input was validated) and return it."""
    path = Path(output_dir)
    if path.is_dir():
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path
