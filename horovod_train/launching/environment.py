"""Who am I in the job? Rank, local rank, world size and master address under every launcher, and the GPU a rank
uses.

The launcher table (``LAUNCHERS``) recognises the launcher from this process's variables and reads them; the DDP
engine, the CLI and ``doctor`` ask here. Nothing here joins a process group.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from horovod_train.common.errors import UsageError
from horovod_train.launching import LAUNCHERS, detect_launcher
from horovod_train.launching.base import ALONE, ONE_PROCESS

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DistEnv:
    launcher: str  # the name of its row in LAUNCHERS: torchrun, horovodrun, mpirun, srun or plain
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str | None = None  # None: the launcher gives no rendezvous point for torch.distributed
    master_port: int | None = None

    def export(self) -> None:
        """Set the variables torch.distributed's ``env://`` init reads."""
        if self.master_addr is None or self.master_port is None:
            raise UsageError(
                f"{self.launcher} gives torch.distributed no master address",
                "launch with torchrun, mpirun or srun",
            )
        os.environ.update(
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(self.local_rank),
            LOCAL_WORLD_SIZE=str(self.local_world_size),
        )


def detect(env: Mapping[str, str] | None = None, resolve_master: bool = True) -> DistEnv:
    """The launcher's view of this process. ``resolve_master`` may talk to MPI (mpirun) or run
    ``scontrol`` (srun) to agree on a master address; callers that only need ranks pass False."""
    env = os.environ if env is None else env
    row = detect_launcher(env)
    ranks = row.ranks(env)
    return DistEnv(row.name, *ranks, *row.master(env, ranks.rank, resolve_master))


def check_joins(engine: str, meets: Mapping[str, str], env: Mapping[str, str] | None = None) -> None:
    """The world this process's launcher started can be joined by ``engine``'s ranks: the rendezvous the engine meets
    through is one the launcher's world offers. ``meets``: the rendezvous each engine's ranks meet through, by name
    (the engine rows', engines/joining.py; a one-process engine's own check gives its own alone), ``engine``'s among
    them. Every rank decides it alike, before any trains, so rank 0 says it (errors.exit_with) for every launcher x
    engine pair."""
    env = os.environ if env is None else env
    row = detect_launcher(env)
    size = row.ranks(env).world_size
    offered = row.offers(env) | (ALONE if size == 1 else frozenset())
    needs = meets[engine]
    if needs in offered:
        return
    joining = [name for name, meeting in meets.items() if meeting in offered]
    instead = f"use --engine {either(joining)} under {row.tool}" if joining else ""
    if needs == ONE_PROCESS:
        raise UsageError(
            f"--engine {engine} runs one process but {row.name} started {size}",
            ", or ".join(filter(None, ["start it with plain python", instead])),
        )
    starters = [other.launches_with(needs) for other in LAUNCHERS.values()
                if needs in other.every_rendezvous() and not other.fallback]  # fmt: skip
    processes = f"{size} process{'es' if size > 1 else ''}"
    raise UsageError(
        f"--engine {engine} joins its ranks through {needs}, which the {processes} {row.name} started do not have "
        "(each would train a job of its own, or wait for peers that never come)",
        ", or ".join(filter(None, [f"launch --engine {engine} with {either(starters)}", instead])),
    )


def either(words: list[str]) -> str:
    """'a, b or c'."""
    return " or ".join(filter(None, [", ".join(words[:-1]), words[-1]]))


# How a rank's device was chosen (doctor shows it): rule -> what it means.
DEVICE_RULES = {
    "cpu": "no CUDA device used",
    "local_rank": "cuda:<local rank>, one of the GPUs this node's ranks all see",
    "only_visible": "cuda:0, the one GPU this task sees (srun --gpus-per-task=1, --gpu-bind=single, a pod's GPU)",
    "first": "cuda:0, for a one-process engine",
}


def cuda_device_for(local_rank: int, visible: int) -> tuple[int, str]:
    """The visible GPU a rank uses and the rule that chose it: the only one when the launcher gives each
    task its own GPU (``cuda:<local rank>`` would be an invalid ordinal there), else the local rank's."""
    if visible == 1:
        return 0, "only_visible"
    if local_rank < visible:
        return local_rank, "local_rank"
    raise UsageError(
        f"local rank {local_rank} but only {visible} GPU(s) visible to it on this node",
        "launch at most one process per GPU on each node, or give each task one GPU (srun --gpus-per-task=1)",
    )


def pin_cuda_device(local_rank: int) -> tuple[torch.device, str]:
    """Pick this rank's GPU (``cuda_device_for``) and make it the current device."""
    import torch

    index, rule = cuda_device_for(local_rank, torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index), rule
