"""The GPU check's report, rewritten after every step so that even a killed run leaves one, in at most four
files of its output folder (a lent machine sends back at most 8, 16 MiB each): gpu_check.json (everything),
gpu_check.txt (the plan, the table, what ran and what needs two GPUs), gpu_check.log (the check's output and
every step's, as they go) and details.tar.gz (each step's log, metrics and bench outputs). Standard library only.
"""

from __future__ import annotations

import math
import tarfile
from typing import Any

from horovod_train.common.files import write_json_atomic
from horovod_train.common.tables import format_table
from horovod_train.engines.specs import reference_engine
from horovod_train.gpucheck.runner import Context, Step

TARGETS = {"samples_per_second": 6000.0, "mfu": 0.35, "horovod_vs_plain": 0.97}
TARGETS_MODELS = ("bert-base-cased", "tiny-bert")  # the targets are BERT-base's (tiny-bert's in a dry run)
# What each path of the GPU code needs to have run, and the steps that run it on one GPU.
PATHS = [
    ("NCCL through Horovod: allreduce, allgather, broadcast of CUDA tensors at np=1", ("hvd_collectives",)),
    ("Horovod's gradient all-reduce (DistributedOptimizer's hooks, averaging, fusion of CUDA tensors) through Gloo "
     "on the host, 2 ranks on one GPU, parameters equal to one process's", ("equiv_horovod",)),
    ("DDP's bucketed gradient all-reduce with Gloo on CUDA tensors, 2 ranks on one GPU, parameters equal to one "
     "process's", ("equiv_ddp",)),
    ("DDP over NCCL at np=1 (its reducer at size 1), fp32 and bf16 training", ("ddp_demo", "bert_bf16_ddp")),
    ("The sharded engines over NCCL at np=1: ZeRO-1 and FSDP2 training on CUDA", ("zero1_demo", "fsdp_demo")),
    ("BERT-base bf16 throughput and MFU, Horovod np=1 against plain", ("bench_b128", "bench_b256")),
    ("fp16 with the GradScaler on CUDA (Horovod np=1)", ("bert_fp16",)),
    ("torch.compile (bench)", ("bench_compile_b128",)),
    ("The padding-free step on a 0.5B decoder, bf16, beside its padded step, its loss the padded step's (bench)",
     ("bench_decoder_b256",)),
    ("Horovod np=1 training; DataParallel with one replica", ("horovod_demo", "dp_demo")),
]  # fmt: skip
NEEDS_TWO_GPUS = [
    "Horovod's gradient all-reduce over NCCL between GPUs (NCCL refuses two ranks on one GPU)",
    "DDP's bucketed all-reduce over NCCL between GPUs",
    "ZeRO-1's and FSDP2's sharded collectives (all-gather, reduce-scatter) over NCCL between GPUs",
    "DataParallel with 2+ replicas (each replica's thread autocasts to the run's dtype)",
    "fp16's GradScaler across ranks on GPUs",
    "elastic Horovod resizing on GPUs",
]
NOTES = [
    "Two ranks on one GPU: NCCL refuses them ('Duplicate GPU detected'), so Horovod's gradient all-reduce runs "
    "through a second Horovod built without NCCL (its CUDA tensors are copied to the host and all-reduced by "
    "Gloo: the real DistributedOptimizer hooks, averaging and tensor fusion) and DDP through --ddp_backend gloo "
    "(CUDA tensors, bucketed); both must end within 1e-5 of one process's parameters (docs/equivalence.md). "
    "NCCL itself runs at np=1: Horovod's collectives (hvd_collectives) and DDP's reducer (ddp_demo).",
    "Horovod np=1 (the bench's 'Horovod vs plain'): Horovod 0.28.1 registers its gradient hooks only when size() > 1, "
    "so that ratio measures the DistributedOptimizer wrapper alone, not an all-reduce.",
    "MFU = 6 x non-embedding parameters x non-padding tokens/s / the GPU's peak dense bf16 FLOP/s (table by "
    "device name in horovod_train/bench/gpu/benchmark.py): forward 2 + backward 4 FLOPs per parameter per token; "
    "embeddings (lookups), attention's quadratic term and the padding not counted.",
    "Each step's estimate_s is its time on one H200 with 16 cores (measured 2026-11-26, rounded up; a few steps "
    "still estimates: docs/performance.md); a step starts only if its estimate fits in what is left of --budget_s.",
]
VERDICT = "a 2-GPU run is required for the NCCL all-reduce between GPUs"


def bench_summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The best plain configuration of the BERT sweep, its Horovod np=1 ratio, and the issue's targets."""
    runs = [e for e in entries if e["name"].startswith("bench") and e["status"] == "ok" and "metrics" in e
            and e["metrics"].get("model", TARGETS_MODELS[0]) in TARGETS_MODELS]  # fmt: skip
    if not runs:
        return {}
    plain = reference_engine()
    best = max(runs, key=lambda e: e["metrics"][plain]["samples_per_second"])
    single, hvd = best["metrics"][plain], best["metrics"].get("horovod", {})
    ratio = hvd.get("vs_single", float("nan"))
    return {
        "best": best["name"],
        "torch_compile": best["metrics"]["torch_compile"],
        "batch_size": single["batch_size"],
        "samples_per_second": single["samples_per_second"],
        "tokens_per_second": single["tokens_per_second"],
        "mfu": single["mfu"],
        "horovod_vs_plain": ratio,
        "targets": TARGETS,
        "met": {
            "samples_per_second": single["samples_per_second"] >= TARGETS["samples_per_second"],
            "mfu": single["mfu"] >= TARGETS["mfu"],
            "horovod_vs_plain": ratio >= TARGETS["horovod_vs_plain"],
        },
    }


def padding_free_summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The decoder's padding-free step against its padded one, from the first bench that passed with both."""
    plain = reference_engine()
    flat_name = f"{plain}/padding_free"
    runs = [e for e in entries if e["status"] == "ok" and flat_name in e.get("metrics", {})]
    if not runs:
        return {}
    metrics = runs[0]["metrics"]
    flat, eager = metrics[flat_name], metrics[plain]
    return {"step": runs[0]["name"], "model": metrics["model"], "vs_eager": flat["vs_single"],
            "tokens_per_second": flat["tokens_per_second"], "eager_tokens_per_second": eager["tokens_per_second"],
            "mfu": flat["mfu"], "loss": flat["loss"], "eager_loss": eager["loss"]}  # fmt: skip


def paths(entries: list[dict[str, Any]], dry: bool) -> list[dict[str, str]]:
    """Which of the GPU code's paths ran (and passed), failed or were not run here, and which need two GPUs."""
    status = {e["name"]: e["status"] for e in entries}
    found = []
    for what, names in PATHS:
        ran = [n for n in names if status.get(n) == "ok"]
        failed = [n for n in names if status.get(n) == "failed"]
        state = "FAILED" if failed else ("ran on the CPU (dry run)" if dry else "ran") if ran else "not run"
        found.append({"path": what, "state": state, "steps": ", ".join(failed or ran or names)})
    return found + [{"path": what, "state": "needs 2+ GPUs", "steps": ""} for what in NEEDS_TWO_GPUS]


def plan_rows(steps: list[Step], budget_s: float) -> list[dict[str, Any]]:
    """Each step's estimate and whether the plan's cumulative time keeps it within the budget."""
    rows, total = [], 0.0
    for step in steps:
        total += step.estimate_s
        rows.append({"name": step.name, "estimate_s": step.estimate_s, "cumulative_s": total,
                     "within_budget": total <= budget_s, "what": step.what})  # fmt: skip
    return rows


def build(ctx: Context, steps: list[Step], entries: list[dict[str, Any]], done: bool) -> dict[str, Any]:
    failed = [e["name"] for e in entries if e["status"] == "failed"]
    rows = plan_rows(steps, ctx.args.budget_s)
    return {
        "dry_run": ctx.dry,
        "complete": done,
        "interrupted": ctx.interrupted,
        "running": ctx.running,
        "python": ctx.python,
        "budget_s": ctx.args.budget_s,
        "plan": rows,
        "plan_total_s": sum(r["estimate_s"] for r in rows if r["within_budget"]),
        "environment": next((e.get("metrics", {}) for e in entries if e["name"] == "environment"), {}),
        "steps": entries,
        "failed": failed,
        "ok": done and not failed,
        "bench": bench_summary(entries),
        "padding_free": padding_free_summary(entries),
        "paths": paths(entries, ctx.dry),
        "notes": NOTES,
        "gpu_path_verified": False,  # whatever passed here: see VERDICT
    }


def plan_lines(report: dict[str, Any]) -> list[str]:
    rows = [[r["name"], f"{r['estimate_s']:.0f}", f"{r['cumulative_s']:.0f}",
             "" if r["within_budget"] else "if time is left", r["what"][:90]] for r in report["plan"]]  # fmt: skip
    head = f"plan (seconds on one H100/H200 with 16 cores, as measured on one H200; budget {report['budget_s']:.0f}s,"
    head += f" {report['plan_total_s']:.0f}s planned within it):"
    return [head, *format_table(["step", "est s", "cum s", "", "what"], rows)]


def result_lines(report: dict[str, Any]) -> list[str]:
    rows = [[e["name"], e["status"], f"{e['seconds']:.0f}", f"{e.get('estimate_s', 0):.0f}", e["detail"][:110]]
            for e in report["steps"]]  # fmt: skip
    lines = ["", *format_table(["step", "status", "s", "est s", "detail"], rows)]
    bench = report["bench"]
    if bench:
        met = ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in bench["met"].items())
        ratio = bench["horovod_vs_plain"]
        lines.append(
            f"best bench: {bench['best']}: {bench['samples_per_second']:.0f} samples/s, "
            f"{bench['tokens_per_second']:.0f} tokens/s, MFU {100 * bench['mfu']:.1f}%, Horovod np=1 "
            f"{'n/a' if math.isnan(ratio) else f'{ratio:.3f}x'} plain (targets: {met})"
        )
    flat = report["padding_free"]
    if flat:
        lines.append(
            f"padding-free ({flat['step']}, {flat['model']}): {flat['vs_eager']:.3f}x the padded step's samples/s, "
            f"{flat['tokens_per_second']:.0f} real tokens/s (padded: {flat['eager_tokens_per_second']:.0f}), MFU "
            f"{100 * flat['mfu']:.1f}%; last loss {flat['loss']:.4f} (padded: {flat['eager_loss']:.4f})"
        )
    lines += ["", "paths of the GPU code:"]
    lines += [f"  [{p['state']}] {p['path']}" + (f" ({p['steps']})" if p["steps"] else "") for p in report["paths"]]
    lines += [f"note: {note}" for note in report["notes"]]
    lines.append(f"GPU path verified: no ({VERDICT})")
    if report["dry_run"]:
        lines.append("dry run (CPU, tiny sizes): tests the check's plumbing, measures nothing")
    return lines


def write(ctx: Context, steps: list[Step], entries: list[dict[str, Any]], done: bool) -> dict[str, Any]:
    """gpu_check.json, gpu_check.txt and details.tar.gz, rewritten whole (the log grows as the steps run)."""
    report = build(ctx, steps, entries, done)
    write_json_atomic(ctx.out / "gpu_check.json", report)
    text = "\n".join([*plan_lines(report), *result_lines(report)]) + "\n"
    partial = ctx.out / ".gpu_check.txt.part"
    partial.write_text(text)
    partial.replace(ctx.out / "gpu_check.txt")
    pack_details(ctx)
    return report


def pack_details(ctx: Context) -> None:
    ctx.details.mkdir(parents=True, exist_ok=True)
    partial = ctx.out / ".details.tar.gz.part"
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(ctx.details, arcname="details")
    partial.replace(ctx.out / "details.tar.gz")
