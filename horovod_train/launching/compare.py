"""`horovod-train compare`: one job under every engine this machine supports, each under its real
launcher, with the same global batch; then a table, compare.json and a bar chart. Its runs (an engine under a
launcher: ``Run``, ``supported_runs``, ``execute``, ``summarize``) serve the benchmarks too."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horovod_train.common.errors import UsageError
from horovod_train.common.files import write_json_atomic
from horovod_train.common.tables import format_table
from horovod_train.config.parsing import add_run_arguments, parse_run_config, sections
from horovod_train.config.run_config import RunConfig
from horovod_train.engines.specs import ENGINES, process_group_backend
from horovod_train.launching import Launcher, launcher
from horovod_train.launching.base import ONE_PROCESS
from horovod_train.outputs.run_directory import RunDirectory, claimed

DEFAULT_OUTPUT_DIR = "runs/compare"
# compare's own files in its directory, beside a run directory per run.
LOGS, RESULTS, CHART = "logs", "compare.json", "compare.png"
# Set per run by compare itself, so not passed through from the command line.
PER_RUN = {"output_dir", "overwrite_output_dir", "engine", "per_device_train_batch_size"}


@dataclass(frozen=True)
class Run:
    name: str  # the variant's (engines/specs.py Variant)
    engine: str  # the --engine it trains with
    launcher: str  # its row in the launcher table (LAUNCHERS)
    world_size: int  # processes; a one-process engine takes world_size x the per-rank batch instead
    variant_args: tuple[str, ...] = ()  # what makes an engine's variant differ from its default run

    def row(self) -> Launcher:
        return launcher(self.launcher)

    def command(self, train_args: list[str]) -> list[str]:
        # The variant's arguments last: they are what makes this run differ from the engine's default.
        program = [sys.executable, "-m", "horovod_train", "train", "--engine", self.engine, *train_args]
        return self.launch([*program, *self.variant_args])

    def launch(self, program: list[str], env: Mapping[str, str] | None = None) -> list[str]:
        """``program`` under this run's launcher, its ranks on this machine. horovodrun and torchrun hand their
        environment to the ranks; mpirun is told to forward the variables of ``env`` the ranks need."""
        return self.row().local_command(program, self.world_size, env)


def machine_world_size() -> int:
    """Ranks per multi-process run: one per GPU, or 2 on a CPU-only machine."""
    import torch

    return torch.cuda.device_count() or 2


def supported_runs(world: int) -> list[Run]:
    """Every engine row's variant this machine can run (its launcher's tool installed, what it needs found), in
    the registry's order; a launcher that gives no rendezvous starts one process."""
    backend = process_group_backend()
    runs: list[Run] = []
    for spec in ENGINES.values():
        for variant in spec.variants:
            row = launcher(variant.launcher)
            if row.tool_installed() and variant.ready():
                processes = 1 if row.rendezvous == ONE_PROCESS else world
                runs.append(Run(variant.run_name(backend), spec.name, variant.launcher, processes, variant.args))
    return runs


def select_runs(runs: list[Run], wanted: list[str] | None) -> list[Run]:
    """The runs ``wanted`` names (a run's name, or an engine's: all its runs, variants too); by default every run
    but the engines' variants."""
    if not wanted:
        return [r for r in runs if not r.variant_args]
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
    for section in sections().values():
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


def summarize(run: Run, run_dir: RunDirectory, returncode: int, log: Path) -> dict[str, Any]:
    """One launched training run's outcome from its output directory."""
    # The launcher as users type it (python, not plain).
    row: dict[str, Any] = {**dataclasses.asdict(run), "launcher": run.row().tool, "ok": False, "log": str(log)}
    results = run_dir.read_finished() if returncode == 0 else None
    if results is None:
        return {**row, "error": f"exit code {returncode}"}
    records = run_dir.read_metrics()
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


COLUMNS = ["engine", "launcher", "world", "samples/s", "tokens/s", "train loss", "val acc", "peak MiB/rank"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument(
        "--engines",
        nargs="+",
        help="runs to compare, by run or engine name, comma or space separated (default: all supported)",
    )
    parser.set_defaults(engines=None)


def table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        head = [r["name"], r["launcher"], str(r["world_size"])]
        if not r["ok"]:
            out.append([*head, f"FAILED ({r['error']}), log: {r['log']}"])
            continue
        peak = "/".join(f"{m:.0f}" for m in r["peak_memory_mb_per_rank"])
        out.append(
            [
                *head,
                f"{r['samples_per_second']:.1f}",
                f"{r['tokens_per_second']:.0f}",
                f"{r['final_train_loss']:.4f}",
                f"{r['validation_accuracy']:.4f}",
                peak,
            ]
        )
    width = len(COLUMNS)
    return [row + [""] * (width - len(row)) if len(row) < width else row for row in out]


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["ok"]]
    panels = {
        "samples/s": [r["samples_per_second"] for r in ok],
        "validation accuracy": [r["validation_accuracy"] for r in ok],
        "peak MiB (max over ranks)": [max(r["peak_memory_mb_per_rank"]) for r in ok],
    }
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 0.5 * len(ok) + 1.5), sharey=True)
    names = [r["name"] for r in ok]
    for ax, (title, values) in zip(axes, panels.items(), strict=True):
        ax.bar_label(ax.barh(names, values, color="tab:blue"), fmt="%.4g", padding=2, fontsize=8)
        ax.margins(x=0.25)
        ax.set_title(title)
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(namespace: argparse.Namespace) -> int:
    if namespace.engine is not None:
        raise UsageError("compare runs every engine itself, so --engine does not apply", "select runs with --engines")
    namespace.output_dir = namespace.output_dir or DEFAULT_OUTPUT_DIR
    config = parse_run_config(namespace=namespace)
    world = machine_world_size()
    runs = select_runs(supported_runs(world), namespace.engines)
    outputs = [LOGS, *(run.name for run in runs), RESULTS, CHART]
    with claimed(config.training.output_dir, config.training.overwrite_output_dir, outputs) as out:
        return run_all(namespace, config, runs, world, out)


def run_all(namespace: argparse.Namespace, config: RunConfig, runs: list[Run], world: int, out: Path) -> int:
    (out / LOGS).mkdir()
    batch = config.training.per_device_train_batch_size
    common = passthrough_args(namespace)
    rows = []
    for i, run in enumerate(runs, 1):
        # The same global batch everywhere: W ranks of b, or one process (single, dp) of W x b.
        per_process = batch if run.world_size > 1 else batch * world
        run_dir, log = RunDirectory(out / run.name), out / LOGS / f"{run.name}.log"
        cmd = run.command(
            [*common, "--per_device_train_batch_size", str(per_process), "--output_dir", str(run_dir.path)]
        )
        print(f"[{i}/{len(runs)}] {run.name}: {run.row().tool}, {run.world_size} process(es)", flush=True)
        started = time.perf_counter()
        returncode = execute(cmd, log)
        rows.append(summarize(run, run_dir, returncode, log))
        status = "ok" if rows[-1]["ok"] else f"FAILED (exit {returncode}), see {log}"
        print(f"      {status} in {time.perf_counter() - started:.1f}s", flush=True)

    global_batch = batch * world * config.training.gradient_accumulation_steps
    write_json_atomic(out / RESULTS, {"runs": rows, "train_args": common, "global_batch": global_batch})
    print("\n".join(format_table(COLUMNS, table_rows(rows))))
    if any(r["ok"] for r in rows):
        plot(rows, out / CHART)
    print(f"wrote {out}/: {RESULTS}, {CHART}, one directory and log per run")
    return 0 if all(r["ok"] for r in rows) else 1
