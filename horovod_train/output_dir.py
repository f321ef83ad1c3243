"""One job per output directory, and a record of what this project wrote there.

- **The lock** (``.horovod-train.lock``): rank 0 holds an advisory ``flock`` on it for the whole run, with its
  host and pid inside for the message a second job gets. The kernel drops the lock when its holder exits,
  however it exits, so a crashed or killed job never blocks the next one.
- **The ledger** (``.horovod-train-outputs.json``): the top-level names this project wrote in the directory.
  ``--overwrite_output_dir`` removes those, the project's checkpoints and its crash leftovers, and nothing
  else; a directory that holds anything this project did not write is refused instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from horovod_train.checkpoint import MANIFEST, NAME, STALE
from horovod_train.errors import UsageError
from horovod_train.files import write_json_atomic

LOCK_FILE = ".horovod-train.lock"
LEDGER_FILE = ".horovod-train-outputs.json"
FINISHED_MARKER = "all_results.json"  # written last by a run that finished
TEMPORARY = re.compile(r"\.(?P<name>.+)\.[^.]+\.tmp")  # files.atomic_file's temporaries


def entries(path: Path) -> set[str]:
    """The directory's top-level names, less the lock file (a killed holder leaves it behind)."""
    return {p.name for p in path.iterdir()} - {LOCK_FILE} if path.is_dir() else set()


def recorded(path: Path) -> set[str]:
    try:
        return set(json.loads((path / LEDGER_FILE).read_text())["entries"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def is_own(path: Path, name: str, ledger: set[str]) -> bool:
    """Written by this project: in the ledger, a checkpoint with our manifest, or a leftover of our writes."""
    if name in ledger or name == LEDGER_FILE or STALE.fullmatch(name):
        return True
    if NAME.fullmatch(name):
        return (path / name / MANIFEST).is_file()
    temporary = TEMPORARY.fullmatch(name)
    return temporary is not None and temporary["name"] in ledger


def foreign_entries(path: Path) -> list[str]:
    """What this project did not write in ``path``, sorted."""
    ledger = recorded(path)
    return sorted(name for name in entries(path) if not is_own(path, name, ledger))


def refuse_foreign(path: Path, flag: str) -> None:
    foreign = foreign_entries(path)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise UsageError(
            f"--output_dir {path} holds files this project did not write ({shown}), which {flag} would not remove",
            "give the run a directory of its own (e.g. a new subdirectory), or move those files out",
        )


def record(path: Path, *names: str) -> None:
    """Add ``names`` to the ledger (rank 0 only)."""
    ledger = recorded(path)
    if not set(names) <= ledger:
        write_json_atomic(path / LEDGER_FILE, {"written_by": "horovod-train", "entries": sorted(ledger | set(names))})


@contextlib.contextmanager
def recording(path: Path) -> Iterator[None]:
    """Record every top-level name the block creates in ``path`` (writers that choose their own file names:
    save_pretrained, the trackers)."""
    before = entries(path)
    try:
        yield
    finally:
        created = entries(path) - before - {LEDGER_FILE}
        if created:
            record(path, *created)


def check_output_dir(output_dir: str, overwrite: bool, resuming: bool = False) -> None:
    """Refuse, before anything is written, an output directory that cannot or must not be used."""
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--output_dir {output_dir} is a file", "pass a directory path")
    if entries(path) and not resuming:
        if not overwrite:
            raise UsageError(
                f"--output_dir {output_dir} already holds files of an earlier run",
                "pass --overwrite_output_dir to replace them, or choose another --output_dir",
            )
        refuse_foreign(path, "--overwrite_output_dir")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--output_dir {output_dir} lies inside the file {existing}", "choose a directory path")
    try:  # a real probe: root passes os.access() checks on read-only mounts
        tempfile.TemporaryFile(dir=existing).close()
    except OSError:
        raise UsageError(f"--output_dir {output_dir} is not writable", "choose a directory you can write to") from None


def check_fresh_start(output_dir: Path, overwrite: bool) -> None:
    """``--resume_from_checkpoint auto`` found no valid checkpoint: start over only where that loses nothing
    (an empty directory, or an unfinished earlier attempt of this project) or with --overwrite_output_dir."""
    if not output_dir.is_dir():
        return
    refuse_foreign(output_dir, "starting over")
    if not overwrite and (output_dir / FINISHED_MARKER).exists():
        raise UsageError(
            f"--output_dir {output_dir} holds a finished run ({FINISHED_MARKER}) and no valid checkpoint to resume",
            "pass --overwrite_output_dir to replace it, or choose another --output_dir",
        )


def reset_output_dir(output_dir: str) -> Path:
    """Remove this project's outputs from the directory (only called after every input was validated, with
    the lock held) and start a new ledger. Anything else stays: ``check_output_dir`` refused it earlier."""
    path = Path(output_dir)
    path.mkdir(parents=True, exist_ok=True)
    ledger = recorded(path)
    for name in sorted(entries(path)):
        if not is_own(path, name, ledger):
            continue
        child = path / name
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    return path


class OutputDirLock:
    """Rank 0's exclusive, advisory hold on an output directory for one run."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.path = output_dir / LOCK_FILE
        self.fd: int | None = None
        self.created: list[Path] = []  # directories made to hold the lock, removed again if the run wrote nothing

    def acquire(self) -> None:
        missing = self.output_dir
        while not missing.exists():
            self.created.insert(0, missing)
            missing = missing.parent
        self.output_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self.release()
                raise UsageError(
                    f"--output_dir {self.output_dir} is in use by another job ({self.holder()})",
                    "wait for that job to end, or choose another --output_dir",
                ) from None
            # The holder unlinks the file when it releases: a lock on an unlinked file locks nothing.
            if self._still_linked(fd):
                break
            os.close(fd)
        self.fd = fd
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(holder) + "\n").encode())

    def _still_linked(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def holder(self) -> str:
        try:
            found = json.loads(self.path.read_text())
            return f"pid {found['pid']} on {found['host']}, since {found['since']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "holder unknown"

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)  # closing drops the flock
            self.fd = None
        for directory in reversed(self.created):
            with contextlib.suppress(OSError):
                directory.rmdir()  # only if empty: the run wrote nothing there
        self.created = []


@contextlib.contextmanager
def claimed(output_dir: str, overwrite: bool, outputs: list[str]) -> Iterator[Path]:
    """For a command that fills a directory itself (compare, bench train): checked, locked, emptied of an
    earlier run's outputs, with the names it will write recorded up front (a killed run leaves them own)."""
    path = Path(output_dir)
    check_output_dir(output_dir, overwrite)
    lock = OutputDirLock(path)
    lock.acquire()
    try:
        reset_output_dir(output_dir)
        record(path, *outputs)
        yield path
    finally:
        lock.release()
