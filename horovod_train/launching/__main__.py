"""`python -m horovod_train.launching NAME [options] -- PROGRAM...`: a launcher's command line for the launch/
scripts, NUL-separated (launch/lib.sh's ``hvt_launch_command`` reads it with ``mapfile -d ''``); NAME is a row of
the launcher table that has a ``help``. Only the standard library is imported, so any ``python3`` runs it with the
checkout on its path: a SLURM batch shell that starts an image needs no environment."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from horovod_train.common.errors import UsageError, exit_with
from horovod_train.launching import LAUNCHERS, signalled_rank_variables


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m horovod_train.launching",
        description="Print a launcher's command line, NUL-separated, with PROGRAM (after --) as what it starts.",
    )
    kinds = parser.add_subparsers(dest="kind", required=True)
    for row in LAUNCHERS.values():
        if row.help:
            row.add_arguments(kinds.add_parser(row.name, help=row.help))
    variables = kinds.add_parser("rank-variables", help="print rank variable names, '|'-separated (a regex)")
    variables.add_argument("which", choices=("signalled",))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:split])
    if args.kind == "rank-variables":
        print("|".join(signalled_rank_variables()))
        return 0
    try:
        command = LAUNCHERS[args.kind].command_from(args, argv[split + 1 :])
    except UsageError as error:
        exit_with(error)
    sys.stdout.write("".join(f"{word}\0" for word in command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
