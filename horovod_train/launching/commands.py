"""The one source of launch knowledge: how horovodrun, mpirun, torchrun and srun command lines are built,
and which environment variables tell a process its rank under each launcher.

Python callers (compare, bench, the GPU check, the tests) call the builders; the launch/ scripts call
``python -m horovod_train.launching KIND [options] -- PROGRAM...`` (__main__.py). Only the standard library is
imported.

The mpirun flag set, everywhere mpirun runs (launch/mpirun.sh, compare, bench, the tests): Horovod's documented
flags (mpirun_flags.txt, shipped in the wheel) followed by ``-gmca btl ^openib,ofi``. Open MPI 4.1's libfabric BTL
(ofi), which the documented ``-mca btl ^openib`` leaves loaded, made 6 of 28 runs between two containers start with
TCP round trips of 8-16 ms or 300 us instead of 30 us (0 of 22 with it excluded; docs/launch.md,
scripts/bench_containers.py), and Horovod's MPI controller pays a round trip several times a step. Over Ethernet and
shared memory nothing is lost: Open MPI's own TCP and vader BTLs carry the traffic. ``-gmca`` because Open MPI refuses
a second ``-mca btl`` and horovodrun always passes the documented one; the later ``-gmca`` value wins. (The tests used
``--mca btl self,tcp``, which also drops shared memory between local ranks; the documented set with ofi excluded is
what launch/mpirun.sh and docs/launch.md promise and what the launch tests check.)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from horovod_train.errors import UsageError

MPIRUN_FLAGS_FILE = Path(__file__).with_name("mpirun_flags.txt")
# Open MPI's libfabric BTL excluded on top of the documented `^openib` (see the module docstring).
BTL_WITHOUT_OFI = ["-gmca", "btl", "^openib,ofi"]
# Runs on one machine sharing its cores: more ranks than cores may start, and idle ranks yield instead of busy-polling.
OVERSUBSCRIBE = ["--oversubscribe"]
YIELD_WHEN_IDLE = ["-mca", "mpi_yield_when_idle", "1"]
# mpirun starts remote ranks with its own environment, so variables reach them only when named with -x:
# always PATH (and NCCL_DEBUG, LD_LIBRARY_PATH when set), and every set variable whose name matches.
MPI_FORWARD_FIRST = ("NCCL_DEBUG", "PATH", "LD_LIBRARY_PATH")
MPI_FORWARD_PATTERN = re.compile(r"^(HOROVOD_|NCCL_|HF_|TRANSFORMERS_|PYTHON|OMP_NUM_THREADS$)")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(=.*)?$")

MPI_RANK_PREFIX = "OMPI_COMM_WORLD_"  # what Open MPI's mpirun gives each rank (OMPI_COMM_WORLD_RANK, ..._SIZE, ...)
# Rank variables: (rank, local rank, world size, local world size) as exported by the launchers that set all four.
RANK_VARIABLES: dict[str, tuple[str, str, str, str]] = {
    "torchrun": ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    "horovodrun": ("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE"),
    "mpirun": tuple(f"{MPI_RANK_PREFIX}{name}" for name in ("RANK", "LOCAL_RANK", "SIZE", "LOCAL_SIZE")),
}
# srun's tasks: rank, local rank, world size (the local size comes from the step's tasks-per-node list).
SLURM_RANK_VARIABLES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")
# srun --mpi=pmix / pmi2 give every task one of these, launchers (torchrun's agent, apptainer) included.
PMI_RANK_VARIABLES = ("PMIX_RANK", "PMI_RANK")
# What a torchrun worker has and its agent lacks.
TORCHRUN_WORKER_VARIABLES = ("LOCAL_RANK", "TORCHELASTIC_RUN_ID")


def signalled_rank_variables() -> list[str]:
    """A process with one of these (and the job id) may be a training rank that a stop signal is for
    (launch/slurm/common.sh); SLURM_PROCID is not among them: every srun task has it, launchers included."""
    own = [RANK_VARIABLES[name][0] for name in ("horovodrun", "mpirun")]
    return [*own, *PMI_RANK_VARIABLES, RANK_VARIABLES["torchrun"][1]]


def running_as_root() -> bool:
    return os.geteuid() == 0


def documented_mpirun_flags() -> list[str]:
    """Horovod's documented Open MPI flags ("Run Horovod with Open MPI"), from mpirun_flags.txt."""
    lines = (line.strip() for line in MPIRUN_FLAGS_FILE.read_text().splitlines())
    return [word for line in lines if line and not line.startswith("#") for word in line.split()]


def mpirun_flags(exclude_ofi: bool = True) -> list[str]:
    """The flag set of every mpirun; ``exclude_ofi=False`` only to measure what it was before (bench_containers)."""
    return [*documented_mpirun_flags(), *(BTL_WITHOUT_OFI if exclude_ofi else [])]


def mpi_forwarded(env: Mapping[str, str], extra: Sequence[str] = ()) -> list[str]:
    """``-x NAME`` for each variable the ranks need (``extra``: the user's ``VAR`` or ``VAR=value`` first)."""
    names = list(dict.fromkeys(extra))
    names += [name for name in MPI_FORWARD_FIRST if name in env or name == "PATH"]
    names += sorted(name for name in env if MPI_FORWARD_PATTERN.match(name))
    return [arg for name in dict.fromkeys(names) for arg in ("-x", name)]


def ssh_command_words(port: int | None, identity_file: str | None) -> str:
    """``-p PORT -i KEY`` for Open MPI's plm_rsh_args, which it splits at whitespace (the scripts refuse keys with
    spaces)."""
    return " ".join([*(["-p", str(port)] if port else []), *(["-i", identity_file] if identity_file else [])])


def mpirun_command(
    program: Sequence[str],
    np: int,
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
    mpirun: str = "mpirun",
    root: bool | None = None,
) -> list[str]:
    """Open MPI's mpirun starting ``program`` ``np`` times: the flag set, ``--allow-run-as-root`` when root,
    placement, the variables the ranks need (``mpi_forwarded`` of ``env``, default os.environ)."""
    root = running_as_root() if root is None else root
    placement = [*(["-H", hosts] if hosts else []), *(["--hostfile", hostfile] if hostfile else [])]
    extra: list[str] = []
    if network_interfaces:
        extra += ["-mca", "btl_tcp_if_include", network_interfaces, "-mca", "oob_tcp_if_include", network_interfaces]
    extra += OVERSUBSCRIBE if oversubscribe else []
    extra += YIELD_WHEN_IDLE if yield_when_idle else []
    if ssh_port or ssh_identity_file:
        extra += ["-mca", "plm_rsh_args", ssh_command_words(ssh_port, ssh_identity_file)]
    forwarded = mpi_forwarded(os.environ if env is None else env, forward)
    head = [mpirun, *(["--allow-run-as-root"] if root else []), "-np", str(np), *placement]
    return [*head, *mpirun_flags(exclude_ofi), *extra, *forwarded, *program]


def horovodrun_command(
    program: Sequence[str],
    np: int,
    *,
    controller: str = "gloo",
    hosts: str | None = None,
    ssh_port: int | None = None,
    ssh_identity_file: str | None = None,
    options: Sequence[str] = (),
    exclude_ofi: bool = True,
    horovodrun: str = "horovodrun",
) -> list[str]:
    """horovodrun with the Gloo or MPI controller; ``options`` are horovodrun's own (knobs such as
    ``--fusion-threshold-mb 32``). Under ``--mpi`` the ofi exclusion reaches mpirun through ``--mpi-args``."""
    if controller not in ("gloo", "mpi"):
        raise UsageError(f"horovodrun controller {controller!r} is neither gloo nor mpi", "pass --gloo or --mpi")
    placement = [*(["-H", hosts] if hosts else [])]
    placement += [*(["--ssh-port", str(ssh_port)] if ssh_port else [])]
    placement += [*(["--ssh-identity-file", ssh_identity_file] if ssh_identity_file else [])]
    mpi_args = [f"--mpi-args={' '.join(BTL_WITHOUT_OFI)}"] if controller == "mpi" and exclude_ofi else []
    return [horovodrun, "-np", str(np), *placement, f"--{controller}", *options, *mpi_args, *program]


def torchrun_command(
    program: Sequence[str],
    nproc_per_node: int,
    *,
    nnodes: int | None = None,
    rdzv_id: str | None = None,
    rdzv_endpoint: str | None = None,
    torchrun: str = "torchrun",
) -> list[str]:
    """torchrun: ``--standalone`` (a free local rendezvous port, so concurrent jobs do not collide on 29500) and
    ``program`` a whole command line; or, given ``rdzv_endpoint``, a c10d rendezvous over ``nnodes`` nodes and
    ``program`` what follows torchrun's arguments (e.g. ``-m horovod_train train ...``)."""
    per_node = ["--nproc_per_node", str(nproc_per_node)]
    if rdzv_endpoint is None:
        return [torchrun, "--standalone", *per_node, "--no-python", *program]
    nodes = ["--nnodes", str(nnodes or 1)]
    rdzv = ["--rdzv_id", rdzv_id or "none", "--rdzv_backend", "c10d", "--rdzv_endpoint", rdzv_endpoint]
    return [torchrun, *nodes, *per_node, *rdzv, *program]


def srun_command(
    program: Sequence[str],
    *,
    mpi: str | None = None,
    nodes: int | None = None,
    ntasks: int | None = None,
    ntasks_per_node: int | None = None,
    cpus_per_task: int | None = None,
    overlap: bool = False,
    kill_on_bad_exit: bool = True,
    srun: str = "srun",
) -> list[str]:
    """srun starting ``program`` once per task (``mpi``: the PMI plugin for MPI ranks, e.g. pmix)."""
    counts = {"--nodes": nodes, "--ntasks": ntasks, "--ntasks-per-node": ntasks_per_node}
    counts["--cpus-per-task"] = cpus_per_task
    options = [*([f"--mpi={mpi}"] if mpi else []), *(["--overlap"] if overlap else [])]
    options += [f"{name}={value}" for name, value in counts.items() if value is not None]
    options += ["--kill-on-bad-exit=1"] if kill_on_bad_exit else []
    return [srun, *options, *program]
