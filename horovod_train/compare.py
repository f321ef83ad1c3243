"""`horovod-train compare`: one job under every engine this machine supports, each under its real
launcher, with the same global batch; then a table, compare.json and a bar chart."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from horovod_train import launchers
from horovod_train.config import RunConfig, add_run_arguments, parse_run_config
from horovod_train.errors import UsageError
from horovod_train.files import write_json_atomic
from horovod_train.run_directory import claimed
from horovod_train.tables import format_table

DEFAULT_OUTPUT_DIR = "runs/compare"
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
    world = launchers.machine_world_size()
    runs = launchers.select_runs(launchers.supported_runs(world), namespace.engines)
    outputs = ["logs", *(run.name for run in runs), "compare.json", "compare.png"]
    with claimed(config.training.output_dir, config.training.overwrite_output_dir, outputs) as out:
        return run_all(namespace, config, runs, world, out)


def run_all(namespace: argparse.Namespace, config: RunConfig, runs: list[launchers.Run], world: int, out: Path) -> int:
    (out / "logs").mkdir()
    batch = config.training.per_device_train_batch_size
    common = launchers.passthrough_args(namespace)
    rows = []
    for i, run in enumerate(runs, 1):
        # The same global batch everywhere: W ranks of b, or one process (single, dp) of W x b.
        per_process = batch if run.world_size > 1 else batch * world
        run_dir, log = out / run.name, out / "logs" / f"{run.name}.log"
        cmd = run.command([*common, "--per_device_train_batch_size", str(per_process), "--output_dir", str(run_dir)])
        print(f"[{i}/{len(runs)}] {run.name}: {run.launcher}, {run.world_size} process(es)", flush=True)
        started = time.perf_counter()
        returncode = launchers.execute(cmd, log)
        rows.append(launchers.summarize(run, run_dir, returncode, log))
        status = "ok" if rows[-1]["ok"] else f"FAILED (exit {returncode}), see {log}"
        print(f"      {status} in {time.perf_counter() - started:.1f}s", flush=True)

    global_batch = batch * world * config.training.gradient_accumulation_steps
    write_json_atomic(out / "compare.json", {"runs": rows, "train_args": common, "global_batch": global_batch})
    print("\n".join(format_table(COLUMNS, table_rows(rows))))
    if any(r["ok"] for r in rows):
        plot(rows, out / "compare.png")
    print(f"wrote {out}/: compare.json, compare.png, one directory and log per run")
    return 0 if all(r["ok"] for r in rows) else 1
