"""SLURM's srun: one process per task (DDP, its rendezvous the allocation's first host), or Horovod's MPI ranks
through ``--mpi=pmix``."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from horovod_train.common.errors import UsageError
from horovod_train.launching.base import (
    ENV_RENDEZVOUS,
    HOROVOD_RENDEZVOUS,
    Launcher,
    Master,
    Ranks,
    int_variable,
    positive,
)

RANK, LOCAL_RANK, NTASKS = "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"
STEP_TASKS = "SLURM_STEP_NUM_TASKS"  # an sbatch script itself sees SLURM_PROCID too; only srun's tasks see this
# srun --mpi=pmix / pmi2 give every task one of these, launchers (torchrun's agent, apptainer) included.
PMI_RANK_VARIABLES = ("PMIX_RANK", "PMI_RANK")
COUNTS = ("--nodes", "--ntasks", "--ntasks-per-node", "--cpus-per-task")


def expand_tasks_per_node(spec: str) -> list[int]:
    """Slurm's compact count list: '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in filter(None, spec.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise UsageError(f"cannot parse Slurm tasks per node {spec!r}", "check SLURM_STEP_TASKS_PER_NODE")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def local_size(env: Mapping[str, str]) -> int:
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return 1
    counts = expand_tasks_per_node(spec)
    node = int_variable(env, "SLURM_NODEID", 0)
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


class Srun(Launcher):
    name = tool = "srun"
    signalled = PMI_RANK_VARIABLES  # not SLURM_PROCID: every srun task has it, launchers included
    local = False  # its tasks run in a Slurm allocation, started by the SLURM job scripts
    help = "srun, one program per task"
    rendezvous = ENV_RENDEZVOUS
    rendezvous_offered = (ENV_RENDEZVOUS, HOROVOD_RENDEZVOUS)

    def offers(self, env: Mapping[str, str]) -> frozenset[str]:
        # Horovod's MPI finds its peers through the PMI that `srun --mpi=pmix` (or pmi2) gives each task; without
        # it every task's MPI starts a world of one.
        pmi = any(name in env for name in PMI_RANK_VARIABLES)
        return frozenset(self.every_rendezvous() if pmi else (self.rendezvous,))

    def launches_with(self, rendezvous: str) -> str:
        return "srun --mpi=pmix" if rendezvous == HOROVOD_RENDEZVOUS else self.tool

    def detects(self, env: Mapping[str, str]) -> bool:
        return RANK in env and STEP_TASKS in env

    def ranks(self, env: Mapping[str, str]) -> Ranks:
        size = int_variable(env, NTASKS, int_variable(env, STEP_TASKS, 1))
        return Ranks(int_variable(env, RANK), int_variable(env, LOCAL_RANK, 0), size, local_size(env))

    def master(self, env: Mapping[str, str], rank: int, resolve: bool) -> Master:
        addr = env.get("MASTER_ADDR") or (slurm_master_addr(env) if resolve else None)
        return addr, int_variable(env, "MASTER_PORT", 20000 + int_variable(env, "SLURM_JOB_ID", 0) % 20000)

    def command(
        self,
        program: Sequence[str],
        processes: int | None = None,
        *,
        mpi: str | None = None,
        nodes: int | None = None,
        ntasks_per_node: int | None = None,
        cpus_per_task: int | None = None,
        overlap: bool = False,
        kill_on_bad_exit: bool = True,
        executable: str | None = None,
    ) -> list[str]:
        """srun starting ``program`` once per task (``processes``: --ntasks, None: the allocation's; ``mpi``: the
        PMI plugin for MPI ranks, e.g. pmix)."""
        counts = {"--nodes": nodes, "--ntasks": processes, "--ntasks-per-node": ntasks_per_node}
        counts["--cpus-per-task"] = cpus_per_task
        options = [*([f"--mpi={mpi}"] if mpi else []), *(["--overlap"] if overlap else [])]
        options += [f"{name}={value}" for name, value in counts.items() if value is not None]
        options += ["--kill-on-bad-exit=1"] if kill_on_bad_exit else []
        return [executable or self.tool, *options, *program]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--mpi")
        for count in COUNTS:
            parser.add_argument(count, type=positive)
        parser.add_argument("--overlap", action="store_true")

    def command_from(self, args: argparse.Namespace, program: list[str]) -> list[str]:
        return self.command(program, args.ntasks, mpi=args.mpi, nodes=args.nodes,
                            ntasks_per_node=args.ntasks_per_node, cpus_per_task=args.cpus_per_task,
                            overlap=args.overlap)  # fmt: skip
