"""Launch a training (or any) program under each launcher the way users do: horovodrun, mpirun,
torchrun or plain python. Used by `compare` and the benchmarks; the command lines come from launch_commands, as
those of the launch/ scripts do."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horovod_train import launch_commands
from horovod_train.config import SECTIONS
from horovod_train.errors import UsageError

BIN = Path(sys.executable).parent
# Set per run by compare itself, so not passed through from the command line.
PER_RUN = {"output_dir", "overwrite_output_dir", "engine", "per_device_train_batch_size"}


@dataclass(frozen=True)
class Run:
    name: str  # e.g. horovod-gloo
    engine: str  # the --engine it trains with
    launcher: str  # as shown in the table
    world_size: int  # processes; single and dp take world_size x the per-rank batch instead

    def command(self, train_args: list[str]) -> list[str]:
        return self.launch([sys.executable, "-m", "horovod_train", "train", "--engine", self.engine, *train_args])

    def launch(self, program: list[str], env: Mapping[str, str] | None = None) -> list[str]:
        """``program`` under this run's launcher. horovodrun and torchrun hand their environment to the
        ranks; mpirun is told to forward the variables of ``env`` the ranks need (launch_commands.mpi_forwarded)."""
        n = self.world_size
        if self.launcher == "horovodrun":
            return launch_commands.horovodrun_command(program, n, horovodrun=tool("horovodrun"))
        if self.launcher == "mpirun":
            # Local runs share the cores: more ranks than cores, and idle ranks must yield, not busy-poll.
            return launch_commands.mpirun_command(
                program, n, env=env, oversubscribe=True, yield_when_idle=True, mpirun=tool("mpirun")
            )
        if self.launcher == "torchrun":
            return launch_commands.torchrun_command(program, n, torchrun=tool("torchrun"))
        return program


def tool(name: str) -> str:
    local = BIN / name
    return str(local) if local.is_file() else (shutil.which(name) or name)


def has_tool(name: str) -> bool:
    return (BIN / name).is_file() or shutil.which(name) is not None


def machine_world_size() -> int:
    """Ranks per multi-process run: one per GPU, or 2 on a CPU-only machine."""
    import torch

    return torch.cuda.device_count() or 2


def supported_runs(world: int) -> list[Run]:
    """Every engine/launcher pair this machine can run."""
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count()
    runs: list[Run] = []
    try:
        import horovod.torch as hvd

        if hvd.gloo_built() and has_tool("horovodrun"):
            runs.append(Run("horovod-gloo", "horovod", "horovodrun", world))
        if hvd.mpi_built() and has_tool("mpirun"):
            runs.append(Run("horovod-mpi", "horovod", "mpirun", world))
    except (ImportError, OSError):
        pass
    backend_ok = dist.is_nccl_available() if gpus else dist.is_gloo_available()
    if dist.is_available() and backend_ok and has_tool("torchrun"):
        runs.append(Run(f"ddp-{'nccl' if gpus else 'gloo'}", "ddp", "torchrun", world))
    runs += [Run("single", "single", "python", 1), Run("dp", "dp", "python", 1)]
    return runs


def select_runs(runs: list[Run], wanted: list[str] | None) -> list[Run]:
    if not wanted:
        return runs
    tokens = [t for item in wanted for t in item.split(",") if t]
    known = {r.name for r in runs} | {r.engine for r in runs}
    unknown = [t for t in tokens if t not in known]
    if unknown or not tokens:
        raise UsageError(
            f"--engines {' '.join(unknown or wanted)} is not supported on this machine",
            f"choose from {', '.join(r.name for r in runs)}",
        )
    return [r for r in runs if r.name in tokens or r.engine in tokens]


def passthrough_args(namespace: argparse.Namespace) -> list[str]:
    """The training arguments given on the command line, as arguments for each run's `train`."""
    args = ["--config", namespace.config] if namespace.config else []
    for section in SECTIONS.values():
        for f in dataclasses.fields(section):
            value = getattr(namespace, f.name, None)
            if value is not None and f.name not in PER_RUN:
                args += [f"--{f.name}", str(value)]
    return args


def execute(cmd: list[str], log: Path, env: Mapping[str, str] | None = None) -> int:
    """Run one launch with its output in ``log`` (the command line first); return its exit code."""
    with log.open("w") as log_file:
        log_file.write(" ".join(cmd) + "\n")
        log_file.flush()
        return subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT, check=False, env=env).returncode


def summarize(run: Run, run_dir: Path, returncode: int, log: Path) -> dict[str, Any]:
    """One launched training run's outcome from its output directory."""
    row: dict[str, Any] = {**dataclasses.asdict(run), "ok": False, "log": str(log)}
    results_file = run_dir / "all_results.json"
    if returncode != 0 or not results_file.is_file():
        return {**row, "error": f"exit code {returncode}"}
    results = json.loads(results_file.read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return {
        **row,
        "ok": True,
        "world_size": results["world_size"],
        # Medians over the logging intervals: the first interval includes start-up, later ones evaluation.
        "samples_per_second": statistics.median(r["samples_per_second"] for r in records),
        "tokens_per_second": statistics.median(r["tokens_per_second"] for r in records),
        "final_train_loss": records[-1]["loss"],
        "validation_accuracy": results.get("eval_accuracy", float("nan")),  # none for a regression, CoLA
        "peak_memory_mb_per_rank": results["peak_memory_mb_per_rank"],
        "wall_time_s": results["wall_time_s"],
    }
