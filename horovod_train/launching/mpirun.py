"""Open MPI's mpirun: Horovod's MPI controller in the ranks (or DDP, its rendezvous agreed over MPI); its flags are
open_mpi.py's."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from horovod_train.common.errors import UsageError
from horovod_train.launching.base import (
    ENV_RENDEZVOUS,
    HOROVOD_RENDEZVOUS,
    Launcher,
    Master,
    RankVariables,
    free_port,
    hostname,
    int_variable,
    positive,
)
from horovod_train.launching.open_mpi import (
    OVERSUBSCRIBE,
    YIELD_WHEN_IDLE,
    env_assignment,
    interface_options,
    mpi_forwarded,
    mpirun_flags,
    running_as_root,
    ssh_command_words,
)

MPI_RANK_PREFIX = "OMPI_COMM_WORLD_"  # what Open MPI's mpirun gives each rank (OMPI_COMM_WORLD_RANK, ..._SIZE, ...)


def check_mpi_world(env: Mapping[str, str], mpi_size: int) -> None:
    """Open MPI's rank variables left in the environment without mpirun (exported, copied from a job): MPI starts a
    world of one (a singleton) while the variables promise more ranks, which the process group would wait for until
    --ddp_timeout. One line instead."""
    size = Mpirun.variables.world_size
    if mpi_size != int_variable(env, size):
        stale = sorted(name for name in env if name.startswith(MPI_RANK_PREFIX))
        raise UsageError(
            f"{size}={env[size]} but MPI started {mpi_size} process(es): {', '.join(stale)} are left over in the "
            "environment (this process was not started by mpirun)",
            f"unset {' '.join(stale)}, or launch with mpirun",
        )


class Mpirun(Launcher):
    name = tool = "mpirun"
    # Horovod's launcher as much as horovodrun (`horovodrun --mpi` runs mpirun, and the checkout's mpirun script is
    # Horovod's documented one): its own rendezvous is Horovod's, so it implies DDP only where Horovod is not installed.
    rendezvous = HOROVOD_RENDEZVOUS
    rendezvous_offered = (HOROVOD_RENDEZVOUS, ENV_RENDEZVOUS)  # env://: rank 0's address, broadcast over MPI (master)
    variables = RankVariables(*(f"{MPI_RANK_PREFIX}{name}" for name in ("RANK", "LOCAL_RANK", "SIZE", "LOCAL_SIZE")))
    signalled = (variables.rank,)
    help = "Open MPI's mpirun with Horovod's flags"

    def detects(self, env: Mapping[str, str]) -> bool:
        return self.variables.rank in env

    def master(self, env: Mapping[str, str], rank: int, resolve: bool) -> Master:
        """Rank 0 picks its hostname and a free port and broadcasts them over MPI_COMM_WORLD."""
        if not resolve:
            return None, None
        from mpi4py import MPI

        check_mpi_world(env, MPI.COMM_WORLD.Get_size())
        ours = (hostname(), free_port()) if rank == 0 else None
        addr, port = MPI.COMM_WORLD.bcast(ours, root=0)
        return addr, port

    def command(
        self,
        program: Sequence[str],
        processes: int | None = None,
        *,
        env: Mapping[str, str] | None = None,
        hosts: str | None = None,
        hostfile: str | None = None,
        forward: Sequence[str] = (),
        network_interfaces: str | None = None,
        ssh_port: int | None = None,
        ssh_identity_file: str | None = None,
        oversubscribe: bool = False,
        yield_when_idle: bool = False,
        exclude_ofi: bool = True,
        executable: str | None = None,
        root: bool | None = None,
    ) -> list[str]:
        """mpirun starting ``program`` ``processes`` times (-np): the flag set, ``--allow-run-as-root`` when root,
        placement, the variables the ranks need (``mpi_forwarded`` of ``env``, default os.environ)."""
        root = running_as_root() if root is None else root
        placement = [*(["-H", hosts] if hosts else []), *(["--hostfile", hostfile] if hostfile else [])]
        extra = interface_options(network_interfaces) if network_interfaces else []
        extra += OVERSUBSCRIBE if oversubscribe else []
        extra += YIELD_WHEN_IDLE if yield_when_idle else []
        if ssh_port or ssh_identity_file:
            extra += ["-mca", "plm_rsh_args", ssh_command_words(ssh_port, ssh_identity_file)]
        forwarded = mpi_forwarded(os.environ if env is None else env, forward)
        head = [executable or self.tool, *(["--allow-run-as-root"] if root else []), "-np", str(processes)]
        return [*head, *placement, *mpirun_flags(exclude_ofi), *extra, *forwarded, *program]

    def local_command(self, program: Sequence[str], processes: int, env: Mapping[str, str] | None = None) -> list[str]:
        # Local runs share the cores: more ranks than cores, and idle ranks must yield, not busy-poll.
        return self.command(
            program, processes, env=env, oversubscribe=True, yield_when_idle=True, executable=self.find_tool()
        )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--np", type=positive, required=True)
        parser.add_argument("--hosts")
        parser.add_argument("--hostfile")
        parser.add_argument("-x", dest="forward", action="append", default=[], type=env_assignment)
        parser.add_argument("--network-interfaces")
        parser.add_argument("--ssh-port", type=positive)
        parser.add_argument("--ssh-identity-file")
        parser.add_argument("--oversubscribe", action="store_true")

    def command_from(self, args: argparse.Namespace, program: list[str]) -> list[str]:
        if args.hosts and args.hostfile:
            raise UsageError("both -H and --hostfile given", "pass one of them")
        return self.command(program, args.np, hosts=args.hosts, hostfile=args.hostfile, forward=args.forward,
                            network_interfaces=args.network_interfaces, ssh_port=args.ssh_port,
                            ssh_identity_file=args.ssh_identity_file, oversubscribe=args.oversubscribe)  # fmt: skip
