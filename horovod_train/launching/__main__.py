"""`python -m horovod_train.launching KIND [options] -- PROGRAM...`: a launcher's command line for the launch/
scripts, NUL-separated (launch/lib.sh's ``hvt_launch_command`` reads it with ``mapfile -d ''``). Only the standard
library is imported, so any ``python3`` runs it with the checkout on PYTHONPATH: a SLURM batch shell that starts an
image needs no environment."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from horovod_train.errors import UsageError, exit_with
from horovod_train.launching.commands import (
    ENV_NAME,
    horovodrun_command,
    mpirun_command,
    signalled_rank_variables,
    srun_command,
    torchrun_command,
)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"needs a whole number >= 1 (got {text!r})")
    return int(text)


def _env_name(text: str) -> str:
    if not ENV_NAME.match(text):
        raise argparse.ArgumentTypeError(f"{text} is not VAR or VAR=value")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m horovod_train.launching",
        description="Print a launcher's command line, NUL-separated, with PROGRAM (after --) as what it starts.",
    )
    kinds = parser.add_subparsers(dest="kind", required=True)
    mpirun = kinds.add_parser("mpirun", help="Open MPI's mpirun with Horovod's flags")
    mpirun.add_argument("--np", type=_positive, required=True)
    mpirun.add_argument("--hosts")
    mpirun.add_argument("--hostfile")
    mpirun.add_argument("-x", dest="forward", action="append", default=[], type=_env_name)
    mpirun.add_argument("--network-interfaces")
    mpirun.add_argument("--ssh-port", type=_positive)
    mpirun.add_argument("--ssh-identity-file")
    mpirun.add_argument("--oversubscribe", action="store_true")
    horovodrun = kinds.add_parser("horovodrun", help="horovodrun, Gloo or MPI controller")
    horovodrun.add_argument("--np", type=_positive, required=True)
    horovodrun.add_argument("--controller", choices=("gloo", "mpi"), default="gloo")
    horovodrun.add_argument("--hosts")
    horovodrun.add_argument("--ssh-port", type=_positive)
    horovodrun.add_argument("--ssh-identity-file")
    horovodrun.add_argument("--option", dest="options", action="append", default=[],
                            help="one word of horovodrun's own options, as --option=WORD")  # fmt: skip
    torchrun = kinds.add_parser("torchrun", help="torchrun, standalone or a c10d rendezvous")
    torchrun.add_argument("--nproc-per-node", type=_positive, required=True)
    torchrun.add_argument("--nnodes", type=_positive)
    torchrun.add_argument("--rdzv-id")
    torchrun.add_argument("--rdzv-endpoint")
    torchrun.add_argument("--torchrun", default="torchrun", help="the torchrun to run (default: from PATH)")
    srun = kinds.add_parser("srun", help="srun, one program per task")
    srun.add_argument("--mpi")
    for count in ("--nodes", "--ntasks", "--ntasks-per-node", "--cpus-per-task"):
        srun.add_argument(count, type=_positive)
    srun.add_argument("--overlap", action="store_true")
    variables = kinds.add_parser("rank-variables", help="print rank variable names, '|'-separated (a regex)")
    variables.add_argument("which", choices=("signalled",))
    return parser


def command_from(args: argparse.Namespace, program: list[str]) -> list[str]:
    if args.kind == "mpirun":
        if args.hosts and args.hostfile:
            raise UsageError("both -H and --hostfile given", "pass one of them")
        return mpirun_command(program, args.np, hosts=args.hosts, hostfile=args.hostfile, forward=args.forward,
                              network_interfaces=args.network_interfaces, ssh_port=args.ssh_port,
                              ssh_identity_file=args.ssh_identity_file, oversubscribe=args.oversubscribe)  # fmt: skip
    if args.kind == "horovodrun":
        return horovodrun_command(program, args.np, controller=args.controller, hosts=args.hosts,
                                  ssh_port=args.ssh_port, ssh_identity_file=args.ssh_identity_file,
                                  options=args.options)  # fmt: skip
    if args.kind == "torchrun":
        return torchrun_command(program, args.nproc_per_node, nnodes=args.nnodes, rdzv_id=args.rdzv_id,
                                rdzv_endpoint=args.rdzv_endpoint, torchrun=args.torchrun)  # fmt: skip
    return srun_command(program, mpi=args.mpi, nodes=args.nodes, ntasks=args.ntasks,
                        ntasks_per_node=args.ntasks_per_node, cpus_per_task=args.cpus_per_task,
                        overlap=args.overlap)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:split])
    if args.kind == "rank-variables":
        print("|".join(signalled_rank_variables()))
        return 0
    try:
        command = command_from(args, argv[split + 1 :])
    except UsageError as error:
        exit_with(error)
    sys.stdout.write("".join(f"{word}\0" for word in command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
