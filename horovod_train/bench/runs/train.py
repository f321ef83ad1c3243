"""`horovod-train bench train`: samples/s per engine and world size on one job, through compare's launches.

Every run trains the same job with the same per-rank batch (weak scaling): world size W reads W x b
examples per step. Scaling efficiency is samples/s / (W x samples/s of the reference engine at W = 1: the row
that says it is the reference, single).
Runs are interleaved (A B C A B C ...) over --repeats passes and the median of each is reported, so a
load spike on a shared machine hits every engine alike. samples/s is compare's: the median over the
run's logging intervals (start-up and evaluation fall outside most of them); wall time is the whole
`train` command, start-up and evaluation included.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from horovod_train.bench import architectures, outputs
from horovod_train.bench.engine_names import engine_names, reference_engine
from horovod_train.common.errors import UsageError
from horovod_train.common.tables import format_table
from horovod_train.config.parsing import parse_run_config
from horovod_train.config.run_config import RunConfig
from horovod_train.launching import compare
from horovod_train.outputs.run_directory import RunDirectory, claimed

# The mission's comparison (the Horovod/DDP ratio line); a renamed or removed engine fails here, at import.
HOROVOD, DDP = engine_names("horovod", "ddp")
DEFAULT_CONFIG = "demo"  # horovod_train/configs/demo.yaml, shipped in the package
DEFAULT_MAX_STEPS = 300
# --model_size bert-base: bert-base-cased's architecture random-initialised on the tiny tokenizer (86.3 M
# parameters, 329 MiB of float32 gradients per step; its 12 layers are BERT-base's, its embedding has the
# tokenizer's 298 rows), dynamic padding (up to 128 tokens), 8 examples per rank, every step logged: issue 23's job
# (which ran 16 steps; 10 keep `make bench` at about 5 minutes on two cores).
# Each value applies where the command line does not give one.
SIZES: dict[str, dict[str, Any]] = {
    "demo": {},
    "bert-base": {
        "max_seq_length": 128,
        "per_device_train_batch_size": 8,
        "max_steps": 10,
        "logging_steps": 1,
        "synthetic_num_examples": 400,
        "max_eval_samples": 8,
        "eval_strategy": "no",
        "save_strategy": "no",
    },
}
COLUMNS = [
    "name",
    "engine",
    "launcher",
    "world_size",
    "repeats",
    "samples_per_second",
    "samples_per_second_min",
    "samples_per_second_max",
    "tokens_per_second",
    "wall_time_s",
    "scaling_efficiency",
    "validation_accuracy",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    compare.add_arguments(parser)
    parser.add_argument(
        "--world_sizes",
        nargs="+",
        type=int,
        default=None,
        help="world sizes to run (default: 1 and the machine's: GPUs, or 2 on CPU)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="interleaved passes over every run (medians kept)")
    parser.add_argument(
        "--model_size",
        choices=list(SIZES),
        default="demo",
        help="the demo job, or bert-base-cased's architecture (random init, 8 examples per rank, 10 steps)",
    )


def baseline_run() -> compare.Run:
    """The reference engine's own run (its row's default variant, one process): what every run is divided by."""
    reference = reference_engine()
    return next(r for r in compare.supported_runs(1) if r.engine == reference and not r.variant_args)


def plan(world_sizes: list[int], wanted: list[str] | None) -> list[compare.Run]:
    """Every supported multi-process run at each world size, plus the reference engine's baseline at 1."""
    runs = [baseline_run()]
    for world in world_sizes:
        runs += [r for r in compare.supported_runs(world) if not r.row().fallback]
    selected = compare.select_runs(runs, wanted)
    if runs[0] not in selected:
        selected.insert(0, runs[0])  # the baseline of the scaling efficiency
    return selected


def run_name(run: compare.Run) -> str:
    return f"{run.name}-np{run.world_size}"


def aggregate(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for r in raw:
        rows.setdefault(
            r["key"],
            {
                "name": r["name"],
                "engine": r["engine"],
                "launcher": r["launcher"],
                "world_size": r["world_size"],
                "samples": [],
                "tokens": [],
                "wall": [],
                "acc": [],
            },
        )
        if r["ok"]:
            row = rows[r["key"]]
            row["samples"].append(r["samples_per_second"])
            row["tokens"].append(r["tokens_per_second"])
            row["wall"].append(r["wall_time_s"])
            row["acc"].append(r["validation_accuracy"])
    out = []
    for row in rows.values():
        samples = row.pop("samples")
        out.append(
            {
                **row,
                "repeats": len(samples),
                "samples_per_second": outputs.median(samples),
                "samples_per_second_min": min(samples, default=float("nan")),
                "samples_per_second_max": max(samples, default=float("nan")),
                "tokens_per_second": outputs.median(row.pop("tokens")),
                "wall_time_s": outputs.median(row.pop("wall")),
                "validation_accuracy": outputs.median(row.pop("acc")),
            }
        )
    base = baseline(out)
    for r in out:
        r["scaling_efficiency"] = (
            r["samples_per_second"] / (r["world_size"] * base["samples_per_second"]) if base else float("nan")
        )
        # W ranks do at most W times the single process's work: an efficiency of 1 at best.
        versus = compared(r, base, ideal=r["world_size"]) if base and r["repeats"] and r is not base else {}
        r["scaling_efficiency_unresolved"] = versus.get("unresolved")
    return out


def baseline(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The reference engine at world size 1, which the scaling efficiency and the ratios to it divide by; None
    when it measured nothing."""
    reference = reference_engine()
    return next((r for r in rows if r["engine"] == reference and r["world_size"] == 1 and r["repeats"]), None)


def single_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each multi-process run's samples/s over the single process's: on one machine, how close the ranks
    come to one process using every core (the compute limit)."""
    single = baseline(rows)
    if single is None:
        return []
    return [
        {"run": r["name"], "world_size": r["world_size"], **compared(r, single, ideal=r["world_size"])}
        for r in rows
        if r["world_size"] > 1 and r["repeats"]
    ]


def compared(top: dict[str, Any], bottom: dict[str, Any], ideal: float | None = None) -> dict[str, Any]:
    """``top``'s samples/s over ``bottom``'s (medians), the range their repeats allow, and why it is no result."""
    ratio = top["samples_per_second"] / bottom["samples_per_second"]
    low, high = ratio_range(top, bottom, "samples_per_second")
    return {"ratio": ratio, "range": [low, high], "unresolved": unresolved(ratio, low, high, ideal)}


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Horovod/DDP samples/s (and wall-time) ratios at every world size where either was planned; where the other
    was not, or every run of one failed, an entry saying so (``missing``) instead of a ratio."""
    found = []
    for world in sorted({r["world_size"] for r in rows}):
        at = [r for r in rows if r["world_size"] == world]
        hvds, ddps = [r for r in at if r["engine"] == HOROVOD], [r for r in at if r["engine"] == DDP]
        if not hvds and not ddps:
            continue
        ddp = next((r for r in ddps if r["repeats"]), None)
        for hvd in hvds or [None]:
            names = {"world_size": world, "horovod": hvd and hvd["name"], "ddp": ddp and ddp["name"]}
            missing = [why for why in (lacking(HOROVOD, [hvd] if hvd else []), lacking(DDP, ddps)) if why]
            if missing or hvd is None or ddp is None:
                found.append({**names, "missing": "; ".join(missing)})
                continue
            versus = compared(hvd, ddp)
            found.append(
                {
                    **names,
                    "samples_per_second_ratio": versus["ratio"],
                    "samples_per_second_range": versus["range"],
                    "unresolved": versus["unresolved"],
                    "wall_time_ratio": ddp["wall_time_s"] / hvd["wall_time_s"],
                }
            )
    return found


def lacking(engine: str, runs: list[dict[str, Any]]) -> str | None:
    """Why ``engine`` gives no side of a ratio (no run of it, or every run failed), or None."""
    if not runs:
        return f"no {engine} run"
    if not any(r["repeats"] for r in runs):
        return f"every run of {', '.join(r['name'] for r in runs)} failed"
    return None


def validate(namespace: argparse.Namespace) -> tuple[RunConfig, list[int]]:
    """Every argument against its domain (the runs' as `train` checks them); nothing is launched or written."""
    if namespace.engine is not None:
        raise UsageError("bench train runs every engine itself, so --engine does not apply", "select with --engines")
    if namespace.repeats < 1:
        raise UsageError(f"--repeats must be >= 1 (got {namespace.repeats})", "pass --repeats 1 or more")
    # The demo runs every engine at 1 and at the machine's world size; bert-base, to fit in minutes, only at
    # the machine's (the single process at 1 is always there: it is the baseline).
    machine = compare.machine_world_size()
    world_sizes = namespace.world_sizes or sorted({machine} if namespace.model_size == "bert-base" else {1, machine})
    if min(world_sizes) < 1:
        raise UsageError(f"--world_sizes must be >= 1 (got {world_sizes})", "pass e.g. --world_sizes 1 2")
    for name, value in SIZES[namespace.model_size].items():
        if getattr(namespace, name, None) is None:
            setattr(namespace, name, value)
    namespace.config = namespace.config or DEFAULT_CONFIG  # the embedded job
    namespace.max_steps = namespace.max_steps or DEFAULT_MAX_STEPS
    namespace.output_dir = namespace.output_dir or "runs/bench/train"
    return parse_run_config(namespace=namespace), world_sizes


def main(namespace: argparse.Namespace) -> int:
    config, world_sizes = validate(namespace)
    runs = plan(world_sizes, namespace.engines)
    names = [f"{run_name(run)}-r{rep}" for rep in range(namespace.repeats) for run in runs]
    outputs = ["logs", "configs", *names, *(f"bench_train.{suffix}" for suffix in ("csv", "json", "png"))]
    with claimed(config.training.output_dir, config.training.overwrite_output_dir, outputs) as out:
        return run_all(namespace, config, runs, out)


def job_args(namespace: argparse.Namespace, out: Path) -> list[str]:
    """Every run's training arguments; bert-base's model config is written into ``out``/configs."""
    args = compare.passthrough_args(namespace)
    if namespace.model_size == "bert-base" and namespace.config_name is None:
        config_dir = out / "configs" / "bert-base"
        architectures.bert_config("bert-base-cased").save_pretrained(config_dir)
        args += ["--config_name", str(config_dir)]
    return args


def run_all(namespace: argparse.Namespace, config: RunConfig, runs: list[compare.Run], out: Path) -> int:
    (out / "logs").mkdir()
    batch = str(config.training.per_device_train_batch_size)
    common_args = job_args(namespace, out)
    raw = []
    for rep in range(namespace.repeats):
        for i, run in enumerate(runs, 1):
            key = run_name(run)
            run_dir, log = out / f"{key}-r{rep}", out / "logs" / f"{key}-r{rep}.log"
            cmd = run.command([*common_args, "--per_device_train_batch_size", batch, "--output_dir", str(run_dir)])
            print(f"[{rep + 1}/{namespace.repeats} {i}/{len(runs)}] {key}", end=" ", flush=True)
            started = time.perf_counter()
            row = compare.summarize(run, RunDirectory(run_dir), compare.execute(cmd, log), log)
            raw.append({**row, "key": key, "repeat": rep})
            rate = f"{row['samples_per_second']:.1f} samples/s" if row["ok"] else f"FAILED, see {log}"
            print(f"{rate} ({time.perf_counter() - started:.0f}s)", flush=True)
    rows = aggregate(raw)
    found, versus_single = ratios(rows), single_ratios(rows)
    outputs.write_rows(
        out,
        "bench_train",
        COLUMNS,
        rows,
        ratios=found,
        versus_single=versus_single,
        raw=raw,
        train_args=common_args,
        model_size=namespace.model_size,
        per_device_train_batch_size=int(batch),
    )
    print("\n".join([*format_table(*table(rows)), *report_lines(rows, found, versus_single, namespace.repeats)]))
    if any(r["repeats"] for r in rows):
        plot(rows, out / "bench_train.png")
    print(f"wrote {out}/: bench_train.csv, bench_train.json, bench_train.png, one directory and log per run")
    return 0 if all(r["ok"] for r in raw) else 1


def report_lines(
    rows: list[dict[str, Any]], found: list[dict[str, Any]], versus_single: list[dict[str, Any]], repeats: int
) -> list[str]:
    """Below the table: why each efficiency marked ``?`` is no result, then the ratios, each a result or flagged."""
    lines = [
        f"? {r['name']} np={r['world_size']}: efficiency {r['scaling_efficiency']:.2f} is no result: {why}"
        for r in rows
        if (why := r.get("scaling_efficiency_unresolved"))
    ]
    reference = reference_engine()
    if baseline(rows) is None:
        lines.append(f"? no {reference} np=1 run measured: no efficiency or ratio to it (see its log)")
    for r in versus_single:
        ratio, detail = shown(r["ratio"], r["range"], r["unresolved"], repeats)
        lines.append(f"==> {r['run']} np={r['world_size']} / {reference} np=1 samples/s: {ratio} ({detail})")
    for r in found:
        if r.get("missing"):
            lines.append(f"==> Horovod/DDP samples/s at np={r['world_size']}: no result: {r['missing']}")
            continue
        ratio, detail = shown(r["samples_per_second_ratio"], r["samples_per_second_range"], r["unresolved"], repeats)
        lines.append(
            f"==> Horovod/DDP samples/s at np={r['world_size']}: {ratio}, {r['horovod']} vs {r['ddp']} "
            f"({detail}; wall-time speed ratio {r['wall_time_ratio']:.3f}x)"
        )
    return lines


def shown(ratio: float, bounds: list[float], unresolved: str | None, repeats: int) -> tuple[str, str]:
    """A ratio and what backs it (``1.096x``, ``1.003..1.130 over the runs' min..max, medians of 3``), or the
    ratio flagged as no result and why."""
    if unresolved:
        return f"{ratio:.3f}x is no result", f"{unresolved}; rerun with more --repeats on a quieter machine"
    if repeats == 1:
        return f"{ratio:.3f}x", "one run each: --repeats 3 shows their noise"
    return f"{ratio:.3f}x", f"{bounds[0]:.3f}..{bounds[1]:.3f} over the runs' min..max, medians of {repeats}"


def table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["run", "launcher", "world", "samples/s (median)", "min..max", "tokens/s", "wall s", "efficiency"]
    body = [
        [
            r["name"],
            r["launcher"],
            str(r["world_size"]),
            f"{r['samples_per_second']:.1f}",
            f"{r['samples_per_second_min']:.1f}..{r['samples_per_second_max']:.1f}",
            f"{r['tokens_per_second']:.0f}",
            f"{r['wall_time_s']:.1f}",
            f"{r['scaling_efficiency']:.2f}" + ("?" if r.get("scaling_efficiency_unresolved") else ""),
        ]
        for r in rows
    ]
    return header, body


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = outputs.pyplot()
    ok = [r for r in rows if r["repeats"]]
    names = [f"{r['name']} np={r['world_size']}" for r in ok]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(ok) + 1.8), sharey=True)
    samples = axes[0].barh(names, [r["samples_per_second"] for r in ok], color="tab:blue")
    axes[0].bar_label(samples, fmt="%.0f", padding=2, fontsize=8)
    axes[0].set_title("samples/s (median)")
    efficiency = axes[1].barh(names, [r["scaling_efficiency"] for r in ok], color="tab:green")
    axes[1].bar_label(efficiency, fmt="%.2f", padding=2, fontsize=8)
    axes[1].set_title(f"scaling efficiency vs {reference_engine()}, np=1")
    for ax in axes:
        ax.margins(x=0.2)
    axes[0].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# How far above what its runs could ideally reach a ratio may measure and still pass for noise, not for a run
# that was slowed.
IDEAL_SLACK = 0.10


def ratio_range(top: Mapping[str, Any], bottom: Mapping[str, Any], key: str) -> tuple[float, float]:
    """Where ``top[key] / bottom[key]`` may lie given each run's spread over its repeats (``key``_min, _max)."""
    return top[f"{key}_min"] / bottom[f"{key}_max"], top[f"{key}_max"] / bottom[f"{key}_min"]


def unresolved(ratio: float, low: float, high: float, ideal: float | None = None) -> str | None:
    """Why a ratio of medians is no result, or None. Either its runs' min and max put it on both sides of 1: their
    noise is larger than the difference it is there to resolve (which of the two is faster). Or it beats what the
    runs could ideally reach (``ideal``): the run it divides by was slowed, as by a load spike, which one run per
    configuration cannot show as a spread."""
    if low < 1 < high:
        return (
            f"its runs' min..max put it anywhere in {low:.3f}..{high:.3f}x, on both sides of 1: their noise is "
            "larger than the difference it measures"
        )
    if ideal is not None and ratio > ideal * (1 + IDEAL_SLACK):
        return f"it is above the ideal {ideal:g}x, so the run it is measured against was slowed (a load spike?)"
    return None
