"""torchrun: PyTorch's launcher, for DDP; standalone on one machine or a c10d rendezvous over nodes."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from horovod_train.launching.base import ENV_RENDEZVOUS, Launcher, Master, RankVariables, int_variable, positive

DEFAULT_MASTER_PORT = 29500
RUN_ID = "TORCHELASTIC_RUN_ID"  # what a torchrun worker has and its agent lacks (LOCAL_RANK too)


class Torchrun(Launcher):
    name = tool = "torchrun"
    rendezvous = ENV_RENDEZVOUS
    variables = RankVariables("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
    signalled = (variables.local_rank,)  # its workers have it, its agent does not
    help = "torchrun, standalone or a c10d rendezvous"

    def detects(self, env: Mapping[str, str]) -> bool:
        return RUN_ID in env or {self.variables.rank, self.variables.world_size, "MASTER_ADDR"} <= env.keys()

    def left_over(self, env: Mapping[str, str]) -> list[str]:
        if RUN_ID in env:
            return []
        return [name for name in (*self.variables, "MASTER_ADDR", "MASTER_PORT") if name in env]

    def master(self, env: Mapping[str, str], rank: int, resolve: bool) -> Master:
        return env.get("MASTER_ADDR", "127.0.0.1"), int_variable(env, "MASTER_PORT", DEFAULT_MASTER_PORT)

    def command(
        self,
        program: Sequence[str],
        processes: int | None = None,
        *,
        nnodes: int | None = None,
        rdzv_id: str | None = None,
        rdzv_endpoint: str | None = None,
        executable: str | None = None,
    ) -> list[str]:
        """torchrun --nproc_per_node ``processes``: ``--standalone`` (a free local rendezvous port, so concurrent
        jobs do not collide on 29500) and ``program`` a whole command line; or, given ``rdzv_endpoint``, a c10d
        rendezvous over ``nnodes`` nodes and ``program`` what follows torchrun's arguments (e.g. ``-m horovod_train
        train ...``)."""
        torchrun, per_node = executable or self.tool, ["--nproc_per_node", str(processes)]
        if rdzv_endpoint is None:
            return [torchrun, "--standalone", *per_node, "--no-python", *program]
        nodes = ["--nnodes", str(nnodes or 1)]
        rdzv = ["--rdzv_id", rdzv_id or "none", "--rdzv_backend", "c10d", "--rdzv_endpoint", rdzv_endpoint]
        return [torchrun, *nodes, *per_node, *rdzv, *program]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--nproc-per-node", type=positive, required=True)
        parser.add_argument("--nnodes", type=positive)
        parser.add_argument("--rdzv-id")
        parser.add_argument("--rdzv-endpoint")
        parser.add_argument("--torchrun", default="torchrun", help="the torchrun to run (default: from PATH)")

    def command_from(self, args: argparse.Namespace, program: list[str]) -> list[str]:
        return self.command(program, args.nproc_per_node, nnodes=args.nnodes, rdzv_id=args.rdzv_id,
                            rdzv_endpoint=args.rdzv_endpoint, executable=args.torchrun)  # fmt: skip
