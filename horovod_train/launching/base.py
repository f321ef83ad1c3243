"""What a launcher is: one object that knows how to recognise the processes it started (their rank, local rank,
world size and master address, from its environment variables), how to write its command line, and the rendezvous
its processes meet through (the engines that join them name a launcher in their rows, engines/specs.py). Lightning's
ClusterEnvironment and Launcher in one row of the table in __init__.py.

Adding a launcher: a ``Launcher`` subclass (its own module here, as horovodrun.py) and one row in ``LAUNCHERS``.
Standard library only: the launch/ scripts run ``python -m horovod_train.launching`` with any ``python3``.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from horovod_train.common.errors import UsageError

# A launcher installed beside this python (a virtual environment's horovodrun or torchrun) comes before PATH's.
BIN = Path(sys.executable).parent
# torch.distributed's rendezvous point, (address, port); None where the launcher gives none.
Master = tuple[str | None, int | None]

# How an engine's ranks find each other: the rendezvous a launcher's world offers, and the one an engine joins through
# (its row's launcher's, engines/specs.py). A world the launcher started that the engine cannot join
# trains W separate jobs of one (Horovod under torchrun) or waits for peers that never come: refused before it starts.
ONE_PROCESS = "no rendezvous (one process)"
ENV_RENDEZVOUS = "torch.distributed's env:// rendezvous (MASTER_ADDR, RANK, WORLD_SIZE)"
HOROVOD_RENDEZVOUS = "Horovod's rendezvous (horovodrun's Gloo, or MPI)"
# A world of one needs no rendezvous: a one-process engine runs in it, and Horovod starts alone where nothing tells
# it of peers. torch.distributed still needs a master address, which a launcher may not give (horovodrun).
ALONE = frozenset({ONE_PROCESS, HOROVOD_RENDEZVOUS})


class Ranks(NamedTuple):
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int


class RankVariables(NamedTuple):
    """The names of the four variables a launcher exports to each of its processes."""

    rank: str
    local_rank: str
    world_size: str
    local_world_size: str

    def read(self, env: Mapping[str, str]) -> Ranks:
        return Ranks(
            int_variable(env, self.rank),
            int_variable(env, self.local_rank, 0),
            int_variable(env, self.world_size),
            int_variable(env, self.local_world_size, 1),
        )


class Launcher:
    """One launcher. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]  # what a process says it was started by (DistEnv.launcher, doctor's first line)
    tool: ClassVar[str]  # the program a user types (compare's table shows it)
    variables: ClassVar[RankVariables | None] = None  # where its processes find their ranks
    # A process with one of these may be a training rank, which the SLURM jobs forward a stop signal to.
    signalled: ClassVar[tuple[str, ...]] = ()
    fallback: ClassVar[bool] = False  # matches every process: detected only when no other row is
    local: ClassVar[bool] = True  # starts ranks on this machine alone (compare, bench, the tests)
    help: ClassVar[str | None] = None  # its `python -m horovod_train.launching` subcommand; None: none
    # What its own engine's ranks meet through: it implies the first engine row that meets through it (doctor).
    rendezvous: ClassVar[str]
    # Every rendezvous its ranks can meet through (its own first); offers() narrows it by the environment.
    rendezvous_offered: ClassVar[tuple[str, ...]] = ()

    def detects(self, env: Mapping[str, str]) -> bool:
        """This process was started by this launcher (its variables are set)."""
        raise NotImplementedError

    def ranks(self, env: Mapping[str, str]) -> Ranks:
        if self.variables is None:
            raise NotImplementedError(f"{self.name} reads no rank variables: override ranks()")
        return self.variables.read(env)

    def master(self, env: Mapping[str, str], rank: int, resolve: bool) -> Master:
        """torch.distributed's rendezvous point. ``resolve`` may talk to MPI or run ``scontrol`` to agree on one;
        without it, what the environment alone says. None: the launcher gives none (its own rendezvous)."""
        return None, None

    @classmethod
    def every_rendezvous(cls) -> tuple[str, ...]:
        """Every rendezvous its ranks can meet through, in some environment."""
        return cls.rendezvous_offered or (cls.rendezvous,)

    def offers(self, env: Mapping[str, str]) -> frozenset[str]:
        """The rendezvous the ranks it started with ``env`` can meet through."""
        return frozenset(self.every_rendezvous())

    def left_over(self, env: Mapping[str, str]) -> list[str]:
        """Its rank variables where they are set but it did not set them (left over from an earlier launch, or set
        by hand): named while a rendezvous waits for peers that may never come."""
        return []

    def launches_with(self, rendezvous: str) -> str:
        """How to start ranks that meet through ``rendezvous`` with this launcher (a fix names it)."""
        return self.tool

    def command(self, program: Sequence[str], processes: int | None = None, **options: Any) -> list[str]:
        """The command line that starts ``program`` as ``processes`` processes, with this launcher's options."""
        raise NotImplementedError

    def local_command(self, program: Sequence[str], processes: int, env: Mapping[str, str] | None = None) -> list[str]:
        """``program`` as ``processes`` ranks on this machine, as compare, bench and the tests start it (``env``:
        the environment the ranks will have, for launchers that forward it)."""
        if not self.local:
            raise UsageError(f"{self.name} starts no ranks on this machine alone", "launch it where it runs (its job)")
        return self.command(program, processes, executable=self.find_tool())

    def find_tool(self) -> str:
        local = BIN / self.tool
        return str(local) if local.is_file() else (shutil.which(self.tool) or self.tool)

    def tool_installed(self) -> bool:
        return (BIN / self.tool).is_file() or shutil.which(self.tool) is not None

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Its options in ``python -m horovod_train.launching NAME`` (rows with a ``help``)."""

    def command_from(self, args: argparse.Namespace, program: list[str]) -> list[str]:
        """The command line those options ask for."""
        raise NotImplementedError


def int_variable(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None:
        if default is None:
            raise UsageError(f"launcher variable {name} is not set", "launch with torchrun, mpirun or srun")
        return default
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"launcher variable {name}={value!r} is not an integer", "check the launch command") from None


def positive(text: str) -> int:
    """An argparse type: a count of processes, nodes or a port."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"needs a whole number >= 1 (got {text!r})")
    return int(text)


def hostname() -> str:
    return socket.gethostname()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
