"""Who am I in the job? Rank, local rank, world size and master address under every launcher.

One place reads the launchers' environment variables (torchrun, horovodrun, mpirun, srun or a plain
``python``); the DDP engine and ``doctor`` both ask it. Nothing here joins a process group.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from horovod_train.errors import UsageError
from horovod_train.launching.commands import (
    MPI_RANK_PREFIX,
    RANK_VARIABLES,
    SLURM_RANK_VARIABLES,
    TORCHRUN_WORKER_VARIABLES,
)

if TYPE_CHECKING:
    import torch

DEFAULT_MASTER_PORT = 29500
# The engine a launcher implies where none is named (doctor): Horovod under its launchers, mpirun among them
# (`horovodrun --mpi` runs mpirun, and launch/mpirun.sh is Horovod's documented mpirun), DDP under torchrun and
# srun, one process under plain python.
LAUNCHER_ENGINES = {"horovodrun": "horovod", "mpirun": "horovod", "torchrun": "ddp", "srun": "ddp", "plain": "single"}


@dataclass(frozen=True)
class DistEnv:
    launcher: str  # torchrun, horovodrun, mpirun, srun or plain
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str | None = None  # None: the launcher gives no rendezvous point for torch.distributed
    master_port: int | None = None

    def implied_engine(self) -> str:
        """``LAUNCHER_ENGINES``'s; where Horovod is not installed, mpirun's ranks join with DDP (through mpi4py)."""
        engine = LAUNCHER_ENGINES[self.launcher]
        if self.launcher == "mpirun" and importlib.util.find_spec("horovod") is None:
            return "ddp"
        return engine

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


def hostname() -> str:
    return socket.gethostname()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None:
        if default is None:
            raise UsageError(f"launcher variable {name} is not set", "launch with torchrun, mpirun or srun")
        return default
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"launcher variable {name}={value!r} is not an integer", "check the launch command") from None


def detect_launcher(env: Mapping[str, str]) -> str:
    """The launcher by its variables (their names: launch_commands.RANK_VARIABLES and the SLURM ones)."""
    torchrun_rank, _, torchrun_size, _ = RANK_VARIABLES["torchrun"]
    if TORCHRUN_WORKER_VARIABLES[1] in env or {torchrun_rank, torchrun_size, "MASTER_ADDR"} <= env.keys():
        return "torchrun"
    horovod_rank, _, horovod_size, _ = RANK_VARIABLES["horovodrun"]
    if horovod_rank in env and horovod_size in env:
        return "horovodrun"
    if RANK_VARIABLES["mpirun"][0] in env:
        return "mpirun"
    # An sbatch script itself also sees SLURM_PROCID/SLURM_NTASKS; only srun's tasks see the step's size.
    if SLURM_RANK_VARIABLES[0] in env and "SLURM_STEP_NUM_TASKS" in env:
        return "srun"
    return "plain"


def _ranks(env: Mapping[str, str], launcher: str) -> tuple[int, int, int, int]:
    if launcher == "plain":
        return 0, 0, 1, 1
    if launcher == "srun":
        rank, local_rank, ntasks = SLURM_RANK_VARIABLES
        size = _int(env, ntasks, _int(env, "SLURM_STEP_NUM_TASKS", 1))
        return _int(env, rank), _int(env, local_rank, 0), size, _slurm_local_size(env)
    rank, local_rank, size, local_size = RANK_VARIABLES[launcher]
    return _int(env, rank), _int(env, local_rank, 0), _int(env, size), _int(env, local_size, 1)


def _master(env: Mapping[str, str], launcher: str, rank: int, resolve: bool) -> tuple[str | None, int | None]:
    if launcher == "torchrun":
        return env.get("MASTER_ADDR", "127.0.0.1"), _int(env, "MASTER_PORT", DEFAULT_MASTER_PORT)
    if launcher == "mpirun":
        return _mpi_master(env, rank) if resolve else (None, None)
    if launcher == "srun":
        addr = env.get("MASTER_ADDR") or (slurm_master_addr(env) if resolve else None)
        return addr, _int(env, "MASTER_PORT", 20000 + _int(env, "SLURM_JOB_ID", 0) % 20000)
    if launcher == "plain":
        return "127.0.0.1", _int(env, "MASTER_PORT", 0) or (free_port() if resolve else None)
    return None, None  # horovodrun --gloo: its rendezvous is Horovod's own


def detect(env: Mapping[str, str] | None = None, resolve_master: bool = True) -> DistEnv:
    """The launcher's view of this process. ``resolve_master`` may talk to MPI (mpirun) or run
    ``scontrol`` (srun) to agree on a master address; callers that only need ranks pass False."""
    env = os.environ if env is None else env
    launcher = detect_launcher(env)
    ranks = _ranks(env, launcher)
    return DistEnv(launcher, *ranks, *_master(env, launcher, ranks[0], resolve_master))


def _mpi_master(env: Mapping[str, str], rank: int) -> tuple[str, int]:
    """Rank 0 picks its hostname and a free port and broadcasts them over MPI_COMM_WORLD."""
    from mpi4py import MPI

    check_mpi_world(env, MPI.COMM_WORLD.Get_size())
    ours = (hostname(), free_port()) if rank == 0 else None
    addr, port = MPI.COMM_WORLD.bcast(ours, root=0)
    return addr, port


def check_mpi_world(env: Mapping[str, str], mpi_size: int) -> None:
    """Open MPI's rank variables left in the environment without mpirun (exported, copied from a job): MPI starts a
    world of one (a singleton) while the variables promise more ranks, which the process group would wait for until
    --ddp_timeout. One line instead."""
    size = RANK_VARIABLES["mpirun"][2]
    if mpi_size != _int(env, size):
        stale = sorted(name for name in env if name.startswith(MPI_RANK_PREFIX))
        raise UsageError(
            f"{size}={env[size]} but MPI started {mpi_size} process(es): {', '.join(stale)} are left over in the "
            "environment (this process was not started by mpirun)",
            f"unset {' '.join(stale)}, or launch with mpirun",
        )


def expand_tasks_per_node(spec: str) -> list[int]:
    """Slurm's compact count list: '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in filter(None, spec.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise UsageError(f"cannot parse Slurm tasks per node {spec!r}", "check SLURM_STEP_TASKS_PER_NODE")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def _slurm_local_size(env: Mapping[str, str]) -> int:
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return 1
    counts = expand_tasks_per_node(spec)
    node = _int(env, "SLURM_NODEID", 0)
    return counts[node] if node < len(counts) else counts[-1]


def slurm_master_addr(env: Mapping[str, str]) -> str:
    """The allocation's first host (`scontrol show hostnames`), else the launch node's address."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    scontrol = shutil.which("scontrol")
    if nodelist and scontrol:
        try:
            out = subprocess.run(
                [scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
            ).stdout.split()
        except (OSError, subprocess.SubprocessError):
            out = []
        if out:
            return out[0]
    if env.get("SLURM_LAUNCH_NODE_IPADDR"):
        return env["SLURM_LAUNCH_NODE_IPADDR"]
    raise UsageError(
        "cannot find the Slurm master host (scontrol failed and SLURM_LAUNCH_NODE_IPADDR is unset)",
        "set MASTER_ADDR or run inside a Slurm allocation",
    )
