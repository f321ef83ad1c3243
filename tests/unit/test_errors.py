"""exit_with on a rank other than 0: quiet while the launcher ends the job, its own line when nothing does."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from horovod_train import errors
from horovod_train.errors import UsageError, exit_with

ERROR = UsageError("a problem", "a fix")


def test_rank_0_says_it_at_once(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        exit_with(ERROR, rank=0)
    assert exited.value.code == 2 and capsys.readouterr().err == "error: a problem; fix: a fix\n"


def test_another_rank_ended_by_the_launcher_exits_2_without_a_word(capsys) -> None:
    """The launcher's SIGTERM once rank 0 has exited: exit 2 like rank 0, not death by the signal (horovodrun's shell
    would print `Terminated` for it)."""
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with pytest.raises(SystemExit) as exited:
        exit_with(ERROR, rank=1)
    assert exited.value.code == 2 and capsys.readouterr().err == ""


def test_another_rank_still_running_after_the_wait_says_it_itself(capsys, monkeypatch) -> None:
    """An error rank 0 did not meet (rank 0 goes on, nothing ends this rank): not lost."""
    monkeypatch.setattr(errors, "QUIET_RANK_WAIT_S", 0.2)
    with pytest.raises(SystemExit) as exited:
        exit_with(ERROR, rank=3)
    assert exited.value.code == 2 and capsys.readouterr().err == "error: a problem; fix: a fix\n"
