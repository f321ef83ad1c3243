"""What a test run shares with other test runs on the same machine (another checkout's `make test`, a second `.ci/run`):
names unique to this session, numbered slots of a machine-wide resource, and machine-wide locks for what one run at a
time may use. docs/launch.md (Developers' notes) lists each shared resource and how it is shared."""

from __future__ import annotations

import fcntl
import os
import random
import secrets
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Unique to this test session (one pytest process), in the names of what it creates on the machine: containers,
# networks, images, network namespaces, interfaces (at most 15 characters: keep what surrounds it short).
SESSION = secrets.token_hex(4)
# Machine-wide whatever TMPDIR each run has: /run/lock (a tmpfs, emptied at boot) where there is one.
LOCK_DIR = Path("/run/lock") if Path("/run/lock").is_dir() else Path("/tmp")


def lock_path(name: str) -> Path:
    return LOCK_DIR / f"horovod-train-tests-{name}.lock"


def open_lock(path: Path) -> int:
    """A descriptor of the lock file, open for writing (POSIX record locks need it), by whichever user made it."""
    try:  # an existing file without O_CREAT: in a sticky world-writable directory (fs.protected_regular) O_CREAT
        return os.open(path, os.O_RDWR)  # is refused on another user's file
    except FileNotFoundError:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        os.fchmod(fd, 0o666)  # whoever runs the tests next, as any user, can lock it too
        return fd


@contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Hold the machine-wide lock ``name``; another test run holding it is waited for, and the wait is reported."""
    fd = open_lock(lock_path(name))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[tests] waiting for {lock_path(name)}: another test run on this machine holds it", file=sys.stderr)
            started = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            print(f"[tests] got {lock_path(name)} after {time.monotonic() - started:.0f} s", file=sys.stderr)
        yield
    finally:
        os.close(fd)  # releases the lock


class Slots:
    """``count`` numbered slots of a machine-wide resource (blocks of SLURM job ids), each held by at most one live
    test process: a POSIX lock on the slot's byte of one lock file, which the kernel drops when the process ends,
    however it ends."""

    def __init__(self, name: str, count: int) -> None:
        self.name, self.count = name, count
        self.fd: int | None = None
        self.mine: set[int] = set()  # a process never conflicts with its own POSIX locks: its slots are kept here

    def take(self) -> int:
        if self.fd is None:  # one descriptor for the process's life: closing any would drop all its locks
            self.fd = open_lock(lock_path(self.name))
        for slot in random.sample(range(self.count), self.count):
            if slot in self.mine:
                continue
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot)
            except OSError:  # held by another process (EAGAIN or EACCES)
                continue
            self.mine.add(slot)
            return slot
        raise AssertionError(f"every one of the {self.count} {self.name} slots is held by another test run")

    def give_back(self, slot: int) -> None:
        assert self.fd is not None and slot in self.mine, slot
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, slot)
        self.mine.discard(slot)
