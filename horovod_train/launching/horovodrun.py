"""horovodrun: Horovod's own launcher, with the Gloo controller (its own rendezvous) or the MPI one (it runs mpirun)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from horovod_train.common.errors import UsageError
from horovod_train.launching.base import HOROVOD_RENDEZVOUS, Launcher, RankVariables, positive
from horovod_train.launching.open_mpi import BTL_WITHOUT_OFI

CONTROLLERS = ("gloo", "mpi")
# `horovodrun --mpi` (and a horovodrun that picks MPI itself) runs mpirun, whose ranks the table reads as mpirun's;
# what tells them apart is the MCA parameters of horovodrun's mpirun command line (--tag-output, -mca pml ob1), which
# reach each rank as variables and which no launch/ script of this project passes together (Open MPI 4).
MPI_COMMAND_MARKS = {"OMPI_MCA_orte_tag_output": "1", "OMPI_MCA_pml": "ob1"}


def ran_mpirun(env: Mapping[str, str]) -> bool:
    """Whether a rank that mpirun started (``env``, its variables) was started through horovodrun."""
    return all(env.get(name) == value for name, value in MPI_COMMAND_MARKS.items())


class Horovodrun(Launcher):
    name = tool = "horovodrun"
    rendezvous = HOROVOD_RENDEZVOUS
    variables = RankVariables("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE")
    signalled = (variables.rank,)
    help = "horovodrun, Gloo or MPI controller"

    def detects(self, env: Mapping[str, str]) -> bool:
        return self.variables.rank in env and self.variables.world_size in env

    # master: none for torch.distributed; Gloo's rendezvous is Horovod's own.

    def command(
        self,
        program: Sequence[str],
        processes: int | None = None,
        *,
        controller: str = "gloo",
        hosts: str | None = None,
        ssh_port: int | None = None,
        ssh_identity_file: str | None = None,
        options: Sequence[str] = (),
        exclude_ofi: bool = True,
        executable: str | None = None,
    ) -> list[str]:
        """horovodrun -np ``processes`` with the Gloo or MPI controller; ``options`` are horovodrun's own (knobs
        such as ``--fusion-threshold-mb 32``). Under ``--mpi`` the ofi exclusion reaches mpirun through
        ``--mpi-args``."""
        if controller not in CONTROLLERS:
            raise UsageError(f"horovodrun controller {controller!r} is neither gloo nor mpi", "pass --gloo or --mpi")
        placement = [*(["-H", hosts] if hosts else [])]
        placement += [*(["--ssh-port", str(ssh_port)] if ssh_port else [])]
        placement += [*(["--ssh-identity-file", ssh_identity_file] if ssh_identity_file else [])]
        mpi_args = [f"--mpi-args={' '.join(BTL_WITHOUT_OFI)}"] if controller == "mpi" and exclude_ofi else []
        head = [executable or self.tool, "-np", str(processes)]
        return [*head, *placement, f"--{controller}", *options, *mpi_args, *program]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--np", type=positive, required=True)
        parser.add_argument("--controller", choices=CONTROLLERS, default="gloo")
        parser.add_argument("--hosts")
        parser.add_argument("--ssh-port", type=positive)
        parser.add_argument("--ssh-identity-file")
        parser.add_argument("--option", dest="options", action="append", default=[],
                            help="one word of horovodrun's own options, as --option=WORD")  # fmt: skip

    def command_from(self, args: argparse.Namespace, program: list[str]) -> list[str]:
        return self.command(program, args.np, controller=args.controller, hosts=args.hosts, ssh_port=args.ssh_port,
                            ssh_identity_file=args.ssh_identity_file, options=args.options)  # fmt: skip
