"""`horovod-train bench allreduce-sweep`: launch `bench allreduce` once per setting and merge the results.

Horovod reads HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME and HOROVOD_CPU_OPERATIONS once, at
``hvd.init``, so every point of the sweep is its own launch (horovodrun for the Gloo controller, mpirun
for the MPI one, through compare.Run). Each controller gets one baseline run with Horovod's defaults
(single tensors and model gradients; torch.distributed too, in the first), then one run per fusion
threshold and per cycle time (model gradients only: a single tensor is never fused).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from horovod_train.bench import architectures, outputs
from horovod_train.bench.communication.allreduce import COLUMNS, HOROVOD_DEFAULTS
from horovod_train.common.errors import UsageError
from horovod_train.common.tables import format_table
from horovod_train.config import domains
from horovod_train.config.arguments import ArgumentParser
from horovod_train.launching import compare

# controller variant -> (launcher, extra environment)
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "gloo": ("horovodrun", {}),
    "mpi": ("mpirun", {}),
    "mpi-gloo-ops": ("mpirun", {"HOROVOD_CPU_OPERATIONS": "gloo"}),
}
SWEEP_COLUMNS = ["variant", "setting", "value", *COLUMNS]


@dataclass
class Point:
    variant: str
    setting: str  # baseline, fusion_threshold_mb or cycle_time_ms
    value: str
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return f"{self.variant}-{self.setting}-{self.value}".replace(".", "p")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output_dir", default="runs/bench/allreduce-sweep")
    parser.add_argument("--np", type=int, default=None, help="ranks per launch (default: GPUs, or 2 on CPU)")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["gloo", "mpi"],
        choices=list(VARIANTS),
        help="gloo: horovodrun --gloo; mpi: mpirun; mpi-gloo-ops: mpirun, HOROVOD_CPU_OPERATIONS=gloo",
    )
    parser.add_argument(
        "--fusion_threshold_mb",
        nargs="*",
        type=float,
        default=[0, 1, 4, 16, 64],
        help="points besides the baseline (Horovod 0.28: 128 MiB; 0 disables fusion)",
    )
    parser.add_argument(
        "--cycle_time_ms",
        nargs="*",
        type=float,
        default=[0.2, 0.5, 2, 5, 10],
        help="points besides the baseline (Horovod 0.28: 1 ms)",
    )
    parser.add_argument("--models", nargs="+", default=list(architectures.MODELS))
    parser.add_argument("--max_bytes", default=None, help="largest single tensor of the baselines")
    parser.add_argument("--repeats", type=int, default=1, help="passes over the grid (interleaved, medians kept)")
    parser.add_argument("--bench_args", default="", help="more arguments for each `bench allreduce`, one string")


def grid(args: argparse.Namespace) -> list[Point]:
    points = []
    models = ["--models", *args.models]
    horovod_only = ["--no_tensors", "--frameworks", "horovod"]
    for i, variant in enumerate(args.variants):
        extra = VARIANTS[variant][1]
        frameworks = ["horovod", "torch"] if i == 0 else ["horovod"]
        sizes = ["--max_bytes", args.max_bytes] if args.max_bytes else []
        points.append(
            Point(variant, "baseline", "default", dict(extra), [*models, *sizes, "--frameworks", *frameworks])
        )
        for mb in args.fusion_threshold_mb:
            env = {**extra, "HOROVOD_FUSION_THRESHOLD": str(int(mb * 2**20))}
            points.append(Point(variant, "fusion_threshold_mb", f"{mb:g}", env, [*models, *horovod_only]))
        for ms in args.cycle_time_ms:
            env = {**extra, "HOROVOD_CYCLE_TIME": f"{ms:g}"}
            points.append(Point(variant, "cycle_time_ms", f"{ms:g}", env, [*models, *horovod_only]))
    return points


def run_point(point: Point, np: int, out: Path, bench_args: list[str], tag: str) -> list[dict[str, Any]]:
    launcher = VARIANTS[point.variant][0]
    run = compare.Run(f"horovod-{point.variant}", "horovod", launcher, np)
    sub = out / "runs" / f"{point.slug}{tag}"
    env = {**os.environ, **point.env}
    program = [
        sys.executable,
        "-m",
        "horovod_train",
        "bench",
        "allreduce",
        "--output_dir",
        str(sub),
        "--label",
        point.slug,
        *point.args,
        *bench_args,
    ]
    log = out / "logs" / f"{point.slug}{tag}.log"
    returncode = compare.execute(run.launch(program, env), log, env)
    if returncode != 0 or not (sub / "allreduce.json").is_file():
        print(f"      {point.slug}: FAILED (exit {returncode}), see {log}", flush=True)
        return []
    rows = json.loads((sub / "allreduce.json").read_text())["rows"]
    return [{"variant": point.variant, "setting": point.setting, "value": point.value, **r} for r in rows]


def merge_repeats(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (point, framework, case, mode): the repeat with the median time."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["label"], r["framework"], r["case"], r["mode"]), []).append(r)
    merged = []
    for group in groups.values():
        ordered = sorted(group, key=lambda r: r["time_us"])
        merged.append({**ordered[(len(ordered) - 1) // 2], "repeats": len(group)})
    return merged


def validate(args: argparse.Namespace) -> None:
    """Every argument against its domain, before the first launch; ``bench allreduce`` takes --bench_args."""
    from horovod_train.bench.communication import allreduce

    domains.writable_dir("output_dir", args.output_dir)
    domains.count(1, example="1")("repeats", args.repeats)
    domains.count(1, example="2")("np", args.np)
    for mb in args.fusion_threshold_mb:
        domains.Number(0.0, example="64")("fusion_threshold_mb", mb)
    for ms in args.cycle_time_ms:
        domains.Number(0.0, example="5")("cycle_time_ms", ms)
    try:
        args.bench_arg_list = shlex.split(args.bench_args)
    except ValueError as exc:
        raise UsageError(
            f"--bench_args {args.bench_args!r} cannot be split ({exc})", "quote it as a shell would"
        ) from None
    extra = [*(["--max_bytes", args.max_bytes] if args.max_bytes else []), *args.bench_arg_list]
    parser = ArgumentParser(prog="horovod-train bench allreduce")  # as the command line names it
    allreduce.add_arguments(parser)
    allreduce.validate(parser.parse_args(["--models", *args.models, *extra]))


def main(args: argparse.Namespace) -> int:
    validate(args)
    np = args.np or compare.machine_world_size()
    out = Path(args.output_dir)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    points = grid(args)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for rep in range(args.repeats):
        for i, point in enumerate(points, 1):
            print(f"[{rep + 1}/{args.repeats} {i}/{len(points)}] {point.slug} {point.env or ''}", flush=True)
            tag = f"-r{rep}" if args.repeats > 1 else ""
            rows += run_point(point, np, out, args.bench_arg_list, tag)
    rows = merge_repeats(rows)
    outputs.write_rows(
        out,
        "sweep",
        SWEEP_COLUMNS,
        rows,
        world_size=np,
        repeats=args.repeats,
        elapsed_s=round(time.perf_counter() - started, 1),
    )
    print("\n".join(format_table(*summary(rows))))
    if rows:
        plot(rows, out / "sweep.png")
    print(f"wrote {out}/: sweep.csv, sweep.json, sweep.png, one directory and log per launch")
    return 0 if len({r["label"] for r in rows}) == len(points) else 1


def summary(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Model gradients per variant and setting: async (fused unless threshold 0) and one call per tensor."""
    header = ["variant", "setting", "value", "model", "mode", "tensors", "time (ms)", "busbw GB/s"]
    body = [
        [
            r["variant"],
            r["setting"],
            r["value"],
            r["case"],
            f"{r['framework']} {r['mode']}",
            str(r["tensors"]),
            f"{r['time_us'] / 1e3:.2f}",
            f"{r['busbw_GBps']:.3f}",
        ]
        for r in rows
        if r["kind"] == "model"
    ]
    return header, body


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = outputs.pyplot()
    defaults = {
        "fusion_threshold_mb": int(HOROVOD_DEFAULTS["HOROVOD_FUSION_THRESHOLD"]) / 2**20,
        "cycle_time_ms": float(HOROVOD_DEFAULTS["HOROVOD_CYCLE_TIME"]),
    }
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, setting in zip(axes, defaults, strict=True):
        fused = [r for r in rows if r["kind"] == "model" and r["framework"] == "horovod" and r["mode"] == "async"]
        for variant, case in dict.fromkeys((r["variant"], r["case"]) for r in fused):
            points = sorted(
                (float(r["value"]) if r["setting"] == setting else defaults[setting], r["time_us"] / 1e3)
                for r in fused
                if r["variant"] == variant and r["case"] == case and r["setting"] in (setting, "baseline")
            )
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{variant} {case}")
        ax.set_xscale("symlog", linthresh=0.1 if setting == "cycle_time_ms" else 1)
        ax.set_yscale("log")
        ax.set_xlabel(setting.replace("_", " "))
        ax.set_ylabel("all-reduce of every gradient (ms)")
        ax.set_title(f"Horovod async all-reduce vs {setting}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
