"""exit_with on a rank other than 0: quiet while the launcher ends the job, its own line when nothing does; the
command line's rank under each launcher."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from horovod_train.cli import main as cli
from horovod_train.common import errors
from horovod_train.common.errors import UsageError, exit_with

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


# A rank 1 as each launcher the README shows tells it (srun too: its jobs are run in tests/system alone).
RANK_1 = {
    "horovodrun": {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"},
    "mpirun": {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
    "torchrun": {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x"},
    "srun": {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2"},
}


@pytest.mark.parametrize("launcher", RANK_1)
def test_the_command_line_knows_a_rank_by_its_launcher(launcher, monkeypatch) -> None:
    launchers = ("HOROVOD_", "OMPI_", "SLURM_", "PMI", "TORCHELASTIC_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_")
    for name in [n for n in os.environ if n.startswith(launchers)]:  # of a job this test runs in
        monkeypatch.delenv(name)
    for name, value in RANK_1[launcher].items():
        monkeypatch.setenv(name, value)
    assert cli.launch_rank() == 1
    monkeypatch.setenv(next(iter(RANK_1[launcher])), "one")  # not a number: this process speaks
    assert cli.launch_rank() == 0
