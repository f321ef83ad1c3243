"""A small filesystem that really fills up: writes to it fail with ENOSPC, as on a full disk (a file-size limit,
RLIMIT_FSIZE, would give EFBIG and SIGXFSZ instead)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_filesystem(path: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``path`` (made here), unmounted on the way out. Mounting needs root:
    the test is skipped where it cannot mount."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    path.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        # Lazily: a file a failed writer left open (a traceback holds it) must not keep the mount.
        subprocess.run(["umount", "--lazy", str(path)], check=True, capture_output=True, timeout=30)


def fill(directory: Path, leave_bytes: int) -> None:
    """Fill the filesystem of ``directory`` until ``leave_bytes`` are free (a file of zeros, written for real)."""
    stats = os.statvfs(directory)
    with (directory / "ballast").open("wb") as f:
        remaining = stats.f_bavail * stats.f_frsize - leave_bytes
        while remaining > 0:
            remaining -= f.write(b"\0" * min(remaining, 1 << 20))
