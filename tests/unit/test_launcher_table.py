"""The launcher table (horovod_train/launching/): a launcher is one object and one row. A toy launcher added to the
table from this module is detected with its ranks, master and engine, and writes its command line for the launch/
scripts and for compare's runs, as the built-in rows do; the table's order decides between launchers nested in
each other."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

import pytest

from horovod_train.cli import doctor
from horovod_train.common.errors import UsageError
from horovod_train.engines.joining import implied_engine
from horovod_train.launching import LAUNCHERS, compare, launcher
from horovod_train.launching.__main__ import main as print_command
from horovod_train.launching.base import ENV_RENDEZVOUS, Launcher, Master, RankVariables, positive
from horovod_train.launching.environment import DistEnv, detect


class Toyrun(Launcher):
    """A launcher that exports TOY_* variables and takes ``-n N``."""

    name = tool = "toyrun"
    rendezvous = ENV_RENDEZVOUS  # its ranks meet as torchrun's: it implies the first engine row that does (ddp)
    variables = RankVariables("TOY_RANK", "TOY_LOCAL_RANK", "TOY_SIZE", "TOY_LOCAL_SIZE")
    signalled = ("TOY_RANK",)
    help = "toyrun, a launcher of the tests"

    def detects(self, env: Mapping[str, str]) -> bool:
        return "TOY_RANK" in env

    def master(self, env: Mapping[str, str], rank: int, resolve: bool) -> Master:
        return env["TOY_HOST"], 4242

    def command(self, program: Sequence[str], processes: int | None = None, *, executable: str | None = None):
        return [executable or self.tool, "-n", str(processes), *program]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-n", type=positive, required=True)

    def command_from(self, args: argparse.Namespace, program: list[str]) -> list[str]:
        return self.command(program, args.n)


TOY_RANK_3_OF_4 = {"TOY_RANK": "3", "TOY_LOCAL_RANK": "1", "TOY_SIZE": "4", "TOY_LOCAL_SIZE": "2", "TOY_HOST": "n9"}


@pytest.fixture
def toyrun(monkeypatch) -> Launcher:
    row = Toyrun()
    monkeypatch.setitem(LAUNCHERS, row.name, row)
    return row


def test_a_launcher_added_to_the_table_is_detected_with_its_ranks_master_and_engine(toyrun):
    found = detect(TOY_RANK_3_OF_4)
    assert found == DistEnv("toyrun", 3, 1, 4, 2, "n9", 4242)
    assert implied_engine(toyrun) == "ddp"
    assert detect({}).launcher == "plain"  # added after plain python, which still catches only the rest
    assert "ddp under torchrun and srun and toyrun" in doctor.implied_engines()


def test_a_launcher_added_to_the_table_writes_its_command_line(toyrun, capsys):
    assert print_command(["toyrun", "-n", "2", "--", "prog", "a b"]) == 0  # what the launch/ scripts read
    assert capsys.readouterr().out.split("\0")[:-1] == ["toyrun", "-n", "2", "prog", "a b"]
    assert compare.Run("toy", "dp", "toyrun", 2).launch(["prog"]) == [toyrun.find_tool(), "-n", "2", "prog"]
    assert print_command(["rank-variables", "signalled"]) == 0
    assert "TOY_RANK" in capsys.readouterr().out.strip().split("|")


def test_an_unknown_launcher_is_one_line():
    with pytest.raises(UsageError, match="unknown launcher 'toyrun'; fix: use one of torchrun, horovodrun"):
        launcher("toyrun")


TORCHRUN_WORKER = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "TORCHELASTIC_RUN_ID": "7"}
SRUN_TASK = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}
HOROVODRUN_RANK = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}
MPIRUN_RANK = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}


@pytest.mark.parametrize(
    ("env", "launcher_name", "rank"),
    [
        (SRUN_TASK | TORCHRUN_WORKER, "torchrun", 1),  # `srun torchrun`: the worker is torchrun's
        (MPIRUN_RANK | HOROVODRUN_RANK, "horovodrun", 1),  # `horovodrun --mpi` runs mpirun
        (SRUN_TASK | MPIRUN_RANK, "mpirun", 1),  # mpirun inside an allocation
        (SRUN_TASK, "srun", 0),
    ],
)
def test_a_process_of_nested_launchers_is_the_innermost_ones(env, launcher_name, rank):
    found = detect(env, resolve_master=False)
    assert (found.launcher, found.rank) == (launcher_name, rank)
