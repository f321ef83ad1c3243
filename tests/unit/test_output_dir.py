"""One job per output directory, and nothing lost in it: --overwrite_output_dir removes only what this project
wrote, a second job is refused while the first runs, a finished run is not rewritten, a requeued attempt
starts over, a moved run directory resumes, and --overwrite_cache rebuilds the shared cache once."""

from __future__ import annotations

import os

import pytest

from horovod_train import output_dir as outdir
from horovod_train.errors import UsageError


def test_the_lock_is_exclusive_and_leaves_no_directory_behind(tmp_path):
    target = tmp_path / "a" / "b"
    first, second = outdir.OutputDirLock(target), outdir.OutputDirLock(target)
    first.acquire()
    with pytest.raises(UsageError, match=f"in use by another job \\(pid {os.getpid()} on "):
        second.acquire()
    assert target.is_dir()  # the refused one must not remove what the holder uses
    first.release()
    assert not (tmp_path / "a").exists()  # made only to hold the lock, and the run wrote nothing
    second.acquire()
    second.release()
