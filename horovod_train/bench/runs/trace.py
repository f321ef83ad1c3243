"""`horovod-train bench trace`: where one optimizer step's time goes, per engine, measured rather than estimated.

Each run of `bench train` (the same job, launchers and world size) is run once more with every rank
recording its step's parts (horovod_train/bench/runs/traced.py: wall-clock spans, a few per step) and, for
Horovod, with its timeline. Per step, over the steps after the first --skip_steps and over the ranks (the main
thread's parts: means over the middle half of the steps by length, so that they add up to the step; the timeline's:
medians):

  main thread    forward, backward (DDP's final wait for its buckets included), Horovod's gradient wait,
                 the optimizer (clip, step, zero_grad), the rest;
  Horovod        from rank 0's timeline, on its background thread: the union of its ALLREDUCE activities,
                 split into the copy into the fusion buffer, the transfer (MPI_/GLOO_ALLREDUCE) and the
                 copy out; and the negotiation (first rank ready to every rank ready).

torch.profiler is not used: its per-operation cost slowed Horovod's ranks 1.7x and DDP's not at all on
BERT-base (docs/performance.md), distorting the very comparison. The timeline costs Horovod a little.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from horovod_train.bench import outputs
from horovod_train.bench.runs import TRACE_DIR_VARIABLE, train
from horovod_train.bench.runs.traced import PARTS, union_ms
from horovod_train.common.errors import UsageError
from horovod_train.common.tables import format_table
from horovod_train.config.run_config import RunConfig
from horovod_train.launching import compare
from horovod_train.outputs.run_directory import RunDirectory, claimed

MAIN_PARTS = ("step", *PARTS, "other")
TIMELINE_PARTS = {
    "allreduce": ("ALLREDUCE",),
    "memcpy_in": ("MEMCPY_IN_FUSION_BUFFER",),
    "transfer": ("MPI_ALLREDUCE", "GLOO_ALLREDUCE", "NCCL_ALLREDUCE"),
    "memcpy_out": ("MEMCPY_OUT_FUSION_BUFFER",),
    "negotiate": ("NEGOTIATE_ALLREDUCE",),
}
OWN_ALLREDUCES = ("allreduce.horovod_train.", "allreduce.noname.")
COLUMNS = ["name", "launcher", "world_size", "steps", "samples_per_second", *MAIN_PARTS]
COLUMNS += ["timeline_samples_per_second", *TIMELINE_PARTS]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    compare.add_arguments(parser)
    parser.add_argument("--model_size", choices=list(train.SIZES), default="bert-base", help="bench train's job")
    parser.add_argument("--skip_steps", type=int, default=2, help="first steps left out (start-up, lazy state)")


def read_timeline(path: Path) -> list[dict[str, Any]]:
    """Horovod writes its timeline as the job runs; a run cut short leaves the JSON list open."""
    text = path.read_text().rstrip().rstrip(",")
    return json.loads(text if text.endswith("]") else text + "]")


def timeline_steps(events: list[dict[str, Any]], steps: int) -> list[dict[str, float]]:
    """Per step, milliseconds of each Horovod activity (the union over tensors: fused ones share their times).
    A gradient is all-reduced once per step, so the k-th activity of every gradient (a tensor all-reduced
    exactly ``steps`` times, not one of the trainer's own) belongs to step k."""
    spans: dict[tuple[int, str], list[tuple[float, float]]] = {}
    open_: dict[int, list[tuple[str, float]]] = {}
    ours = set()  # the trainer's own all-reduces (metrics): named horovod_train.* or left unnamed
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            if e.get("args", {}).get("name", "").startswith(OWN_ALLREDUCES):
                ours.add(e["pid"])
        elif e.get("ph") == "B":
            open_.setdefault(e["pid"], []).append((e["name"], e["ts"]))
        elif e.get("ph") == "E" and open_.get(e["pid"]):
            name, start = open_[e["pid"]].pop()
            spans.setdefault((e["pid"], name), []).append((start, e["ts"]))
    gradients = {
        pid for (pid, name), found in spans.items() if name == "ALLREDUCE" and len(found) == steps and pid not in ours
    }
    rows = []
    for k in range(steps):
        row = {}
        for part, names in TIMELINE_PARTS.items():
            found = [spans[pid, n][k] for pid in gradients for n in names if len(spans.get((pid, n), ())) == steps]
            row[part] = union_ms(found)
        rows.append(row)
    return rows


def summarize(run: compare.Run, trace_dir: Path, skip: int, samples_per_second: float) -> dict[str, Any]:
    """The step and its parts over ranks and measured steps (the timeline's parts: NaN, not yet read)."""
    per_rank = [json.loads(p.read_text())["steps"] for p in sorted(trace_dir.glob("rank*.steps.json"))]
    measured = [s for steps in per_rank for s in steps[skip:]]
    row: dict[str, Any] = {"name": run.name, "launcher": run.row().tool, "world_size": run.world_size}
    row["steps"] = len(per_rank[0]) - skip if per_rank else 0
    row["samples_per_second"] = samples_per_second
    return (
        row
        | middle_half_mean(measured)
        | {part: float("nan") for part in ("timeline_samples_per_second", *TIMELINE_PARTS)}
    )


def middle_half_mean(steps: list[dict[str, float]]) -> dict[str, float]:
    """Each part's mean over the middle half of the steps by their length: the parts add up to the step, as in each
    step (medians taken part by part did not: their sum could exceed the median step), and the slowest and fastest
    quarters (a collection, a late rank) are left out as a median would leave them."""
    if not steps:
        return {part: float("nan") for part in MAIN_PARTS}
    ordered = sorted(steps, key=lambda s: s["step"])
    quarter = len(ordered) // 4
    kept = ordered[quarter : len(ordered) - quarter]
    return {part: statistics.fmean(s[part] for s in kept) for part in MAIN_PARTS}


def timeline_parts(trace_dir: Path, skip: int) -> dict[str, float]:
    """Medians over the measured steps of rank 0's timeline activities."""
    steps = len(json.loads((trace_dir / "rank0.steps.json").read_text())["steps"])
    found = timeline_steps(read_timeline(trace_dir / "timeline.json"), steps)[skip:]
    return {part: outputs.median([s[part] for s in found]) for part in TIMELINE_PARTS}


def validate(namespace: argparse.Namespace) -> tuple[RunConfig, list[int]]:
    """bench train's checks (one pass, at the machine's world size), and --skip_steps leaving steps to measure."""
    namespace.repeats, namespace.world_sizes = 1, [compare.machine_world_size()]
    config, world_sizes = train.validate(namespace)
    if namespace.skip_steps < 0 or namespace.skip_steps >= config.training.max_steps:
        raise UsageError(
            f"--skip_steps must be >= 0 and below --max_steps {config.training.max_steps} (got {namespace.skip_steps})",
            "pass e.g. --skip_steps 2",
        )
    return config, world_sizes


def main(namespace: argparse.Namespace) -> int:
    config, world_sizes = validate(namespace)
    runs = train.plan(world_sizes, namespace.engines)
    names = [train.run_name(run) for run in runs]
    names += [f"{train.run_name(run)}-timeline" for run in runs if run.engine == "horovod"]
    outputs = ["logs", "configs", *names, *(f"{n}-trace" for n in names), "bench_trace.csv", "bench_trace.json"]
    with claimed(config.training.output_dir, config.training.overwrite_output_dir, outputs) as out:
        return run_all(namespace, config, runs, out)


def run_all(namespace: argparse.Namespace, config: RunConfig, runs: list[compare.Run], out: Path) -> int:
    (out / "logs").mkdir()
    common_args = train.job_args(namespace, out)
    train_args = [*common_args, "--per_device_train_batch_size", str(config.training.per_device_train_batch_size)]
    rows, failed, skip = [], [], namespace.skip_steps
    for i, run in enumerate(runs, 1):
        key = train.run_name(run)
        # Horovod twice: its timeline slows the ranks (a writer thread on the same cores), so the step's parts
        # come from a run without it and the all-reduce's parts from a second run with it.
        for timeline in (False, True) if run.engine == "horovod" else (False,):
            name = f"{key}-timeline" if timeline else key
            print(f"[{i}/{len(runs)}] {name}", end=" ", flush=True)
            run_dir, trace_dir = out / name, out / f"{name}-trace"
            args = [*train_args, "--output_dir", str(run_dir)]
            if timeline:
                args += ["--horovod_timeline", str(trace_dir / "timeline.json")]
            outcome = launch_recorded(run, args, run_dir, trace_dir, out / "logs" / f"{name}.log")
            if not outcome["ok"]:
                failed.append(name)
                print(f"FAILED, see {outcome['log']}", flush=True)
                break
            print(f"{outcome['samples_per_second']:.1f} samples/s", flush=True)
            if not timeline:
                rows.append(summarize(run, trace_dir, skip, outcome["samples_per_second"]))
            else:
                rows[-1] |= {
                    **timeline_parts(trace_dir, skip),
                    "timeline_samples_per_second": outcome["samples_per_second"],
                }
    outputs.write_rows(out, "bench_trace", COLUMNS, rows, train_args=common_args, skip_steps=skip)
    print("\n".join(format_table(*table(rows))))
    print(f"wrote {out}/: bench_trace.csv, bench_trace.json; per run <run>-trace/ (rank*.steps.json, timeline.json)")
    return 1 if failed else 0


def launch_recorded(
    run: compare.Run, train_args: list[str], run_dir: Path, trace_dir: Path, log: Path
) -> dict[str, Any]:
    """``train`` (writing ``run_dir``) under ``run``'s launcher, each rank recording its steps into ``trace_dir``;
    bench train's row."""
    program = [sys.executable, "-m", "horovod_train", "train", "--engine", run.engine, *train_args]
    env = {**os.environ, TRACE_DIR_VARIABLE: str(trace_dir)}  # each rank's command line records (runs/traced.py)
    return compare.summarize(run, RunDirectory(run_dir), compare.execute(run.launch(program, env), log, env), log)


def table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["run (ms per step)", "samples/s", "step", "forward", "backward", "grad wait", "optimizer", "other"]
    header += ["with timeline: samples/s", "all-reduce", "copy in", "transfer", "copy out", "negotiate"]
    body = [
        [
            f"{r['name']} np={r['world_size']}",
            f"{r['samples_per_second']:.1f}",
            *(ms(r[p]) for p in MAIN_PARTS),
            ms(r["timeline_samples_per_second"], 1),
            *(ms(r[p]) for p in TIMELINE_PARTS),
        ]
        for r in rows
    ]
    return header, body


def ms(value: float, digits: int = 0) -> str:
    return "-" if value != value else f"{value:.{digits}f}"  # NaN: no timeline
