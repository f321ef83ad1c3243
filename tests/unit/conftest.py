"""The unit tier runs in the test process: a test here that starts a Python program or a launcher fails, and
belongs in tests/integration."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

LAUNCHERS = ("python", "horovodrun", "mpirun", "mpiexec", "torchrun", "srun", "sbatch", "podman", "horovod-train")


@pytest.fixture(autouse=True)
def no_processes_started(monkeypatch) -> Iterator[None]:
    start = subprocess.Popen.__init__

    def refuse_launchers(self, args, *rest, **kwargs):
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        program = os.path.basename(os.fsdecode(argv[0])).split()[0]
        if program.startswith(LAUNCHERS):
            raise AssertionError(f"a unit test started {program}: move it to tests/integration")
        start(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse_launchers)
    yield


@pytest.fixture(autouse=True)
def cache_off_home(monkeypatch, cache_dir) -> None:
    """Data files read without a cache_dir are cached in HOROVOD_TRAIN_CACHE (default ~/.cache): the session's."""
    monkeypatch.setenv("HOROVOD_TRAIN_CACHE", str(cache_dir))
