"""Files written so that a crash never leaves a half-written one behind."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w") -> Iterator[IO]:
    """A file object whose content replaces ``path`` (fsynced) only when the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp's 0600 would hide results from the group
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    with atomic_file(path) as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


@contextlib.contextmanager
def atomic_directory(target: Path, replace: bool = False, tmp: Path | None = None) -> Iterator[Path]:
    """Yield a temporary sibling directory and rename it to ``target`` when the block succeeds.
    If ``target`` appeared meanwhile (another writer won), the temporary copy is discarded, unless
    ``replace``: then the new directory takes its place, the old one moved aside first
    (``previous_of(target)``) and removed only once the new one is in place. ``tmp``: one made by
    ``temporary_sibling`` that other processes have already written into."""
    tmp = tmp or temporary_sibling(target)
    try:
        yield tmp
        follow_umask(tmp)  # mkdtemp's 0700 would hide checkpoints from the group
        previous = previous_of(target)
        if replace and target.is_dir():
            shutil.rmtree(previous, ignore_errors=True)
            os.rename(target, previous)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
        fsync_directory(target.parent)  # the rename itself must survive a crash
        shutil.rmtree(previous, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def temporary_sibling(target: Path) -> Path:
    """A new temporary directory beside ``target``, named as clean-up finds what a crash left (``.<name>.*.tmp``)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))


def current_umask() -> int:
    """The process umask, read without changing it: os.umask() can only set it, racing other threads."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(root: Path) -> None:
    """Give ``root`` and everything under it the modes a plain mkdir()/open() would, as some writers do not:
    safetensors 0.8 saves through a 0600 temporary file."""
    umask = current_umask()
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            executable = path.is_dir() or path.stat().st_mode & 0o111
            path.chmod((0o777 if executable else 0o666) & ~umask)


def previous_of(target: Path) -> Path:
    """Where ``atomic_directory(replace=True)`` keeps the directory it replaces until the new one is in place."""
    return target.with_name(f".{target.name}.previous")


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


FULL = (errno.ENOSPC, errno.EDQUOT)
RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how Rust's std::io::Error shows the OS's code


def disk_full(error: BaseException) -> int | None:
    """ENOSPC or EDQUOT if ``error``, or one it was raised from or while handling, says so: an OSError, or a
    writer's own error (safetensors': ``... No space left on device (os error 28)``; torch.save to a file
    object raises its RuntimeError while handling the file's OSError). None: not a full disk."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        code = error.errno if isinstance(error, OSError) else None
        found = RUST_OS_ERROR.search(str(error)) if code is None else None
        code = int(found[1]) if found else code
        if code in FULL:
            return code
        error = error.__cause__ or error.__context__
    return None


def full_disk_problem(error: BaseException, directory: Path) -> str:
    """``no space left on device in /runs/x (the filesystem mounted at /runs)``."""
    mount = directory.resolve()
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    return f"{os.strerror(disk_full(error) or errno.ENOSPC).lower()} in {directory} (the filesystem mounted at {mount})"
