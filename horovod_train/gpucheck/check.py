"""The GPU check (`scripts/gpu_check.sh`, `make gpu-check`, ``python -m horovod_train.gpucheck``): set up Horovod
offline, then measure and exercise the GPU code on one GPU within a time budget, most valuable first, and leave
a report in the output folder ($OUT/gpu_check on a lent machine, else runs/gpu_check).

Run through the script (it picks the python whose torch is a CUDA build), or from an installed wheel: nothing
here reads the checkout; only the Horovod build steps need its ``scripts/`` (``--scripts_dir``, which the script
passes). ``--dry_run`` prints the node's plan with its estimates, then runs every step that does not need CUDA
on the CPU with tiny sizes, so the plumbing is tested (tests/integration/test_gpu_check.py); ``--plan_only``
prints the plan and stops. Every step is a subprocess with its own log and timeout (steps.py, runner.py); a
step that fails is named and the report is still written, after every step (report.py), and when the check
is ended by SIGTERM or SIGINT, after the step in flight is ended with every process it started.
Only the standard library is imported here: the dependencies may not be installed yet when it starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from horovod_train.common.errors import UsageError, exit_with
from horovod_train.gpucheck import report, steps, wheels
from horovod_train.gpucheck.checks import build_entries
from horovod_train.gpucheck.runner import Context, Interrupted, Step, raise_on_signals, run_step

DEFAULT_BUDGET_S = 480.0  # the whole check, cold, in 8 minutes of one lent machine's 15 (docs/performance.md)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    out = Path(os.environ["OUT"]) / "gpu_check" if os.environ.get("OUT") else Path("runs/gpu_check")
    dry = os.environ.get("HVT_GPU_CHECK_DRY") == "1"
    parser.add_argument("--dry_run", "--dry-run", action="store_true", default=dry, help="CPU, tiny sizes")
    parser.add_argument("--plan_only", "--plan-only", action="store_true", help="print the plan and stop")
    parser.add_argument("--output_dir", type=Path, default=out, help="the report: at most 4 files + kept wheels")
    parser.add_argument("--work_dir", type=Path, default=None, help="models, runs, step logs (not kept unless given)")
    parser.add_argument("--python", default=sys.executable)
    budget = float(os.environ.get("HVT_GPU_CHECK_BUDGET_S", DEFAULT_BUDGET_S))
    parser.add_argument("--budget_s", type=float, default=budget, help="seconds for all the steps")
    parser.add_argument("--demo_config", default="demo", help="the demo job's config (default: the packaged demo)")
    parser.add_argument(
        "--scripts_dir",
        type=Path,
        default=None,
        help="the checkout's scripts/ (build_horovod.sh) for the step builds; scripts/gpu_check.sh passes it",
    )
    parser.add_argument("--steps", default=None, help="comma-separated step names to run (default: all)")
    parser.add_argument("--bert_steps", type=int, default=200, help="training steps of each BERT-base run")
    parser.add_argument("--peak_tflops", type=float, default=None, help="for MFU (default from the GPU's name)")


def wheel_cache() -> Path:
    """build_horovod's wheel cache, from the environment the check was started in (the steps get a work-dir
    cache for their data, not for the wheels: those are kept for a later run on the same machine)."""
    if os.environ.get("HOROVOD_WHEEL_CACHE"):
        return Path(os.environ["HOROVOD_WHEEL_CACHE"]).resolve()
    root = os.environ.get("HOROVOD_TRAIN_CACHE") or Path.home() / ".cache" / "horovod-train"
    return Path(root).resolve() / "wheels"


def check_arguments(args: argparse.Namespace) -> None:
    """The checkout's scripts that the chosen steps run are there, before anything is written."""
    builds = not args.steps or "builds" in args.steps.split(",")
    folder = args.scripts_dir
    if builds and (folder is None or not (folder / "build_horovod.sh").is_file()):
        where = f"--scripts_dir {folder} has no" if folder else "no --scripts_dir for"
        raise UsageError(
            f"{where} build_horovod.sh (the step that builds Horovod runs it)",
            "pass --scripts_dir CHECKOUT/scripts (scripts/gpu_check.sh does), or --steps without builds",
        )
    if args.budget_s <= 0:
        raise UsageError(f"--budget_s {args.budget_s:g}", "give the check a positive number of seconds")


def finish_step(ctx: Context, step: Step, entry: dict[str, Any], started_at: float) -> list[dict[str, Any]]:
    """The entries a step adds beside its own (the two Horovod builds), and the wheels it built kept."""
    if step.name != "builds":
        return []
    parts = build_entries(ctx, step, entry)
    kept = wheels.keep(wheels.new_builds(ctx.wheel_cache, since=started_at), ctx.out)
    if kept:
        ctx.say(f"[gpu-check] kept the new Horovod wheels in {len(kept)} part(s): {ctx.out}/{wheels.PART_PREFIX}*")
    return parts


def run_steps(ctx: Context, plan: list[Step], node_plan: list[Step]) -> dict[str, Any]:
    """Every step in order; the report (with the node's plan) rewritten after each. SIGTERM/SIGINT end the step
    in flight (and all its processes), then the report is written and Interrupted goes on to the caller."""
    entries: list[dict[str, Any]] = []
    try:
        for step in plan:
            started_at = time.time()
            entry = run_step(ctx, step)
            for done in [entry, *finish_step(ctx, step, entry, started_at)]:
                ctx.results[done["name"]] = done
                entries.append(done)
                ctx.say(f"[gpu-check] {done['name']}: {done['status']} {done['detail']}")
            report.write(ctx, node_plan, entries, done=False)
    except Interrupted as signal_name:
        ctx.interrupted = str(signal_name)
        ctx.say(f"[gpu-check] interrupted by {signal_name}: the step in flight and its processes were ended")
        report.write(ctx, node_plan, entries, done=False)
        raise
    return report.write(ctx, node_plan, entries, done=True)


def make_context(args: argparse.Namespace) -> Context:
    out = args.output_dir.resolve()
    work = (args.work_dir or Path(os.environ.get("TMPDIR", "/tmp")) / f"hvt-gpu-check-{os.getpid()}").resolve()
    ctx = Context(args, args.python, out, work, args.dry_run, time.monotonic() + args.budget_s)
    ctx.wheel_cache = wheel_cache()
    ctx.gloo_python = args.python if args.dry_run else str(steps.gloo_env_dir(ctx) / "bin" / "python")
    return ctx


def print_plan(ctx: Context, plan: list[Step]) -> None:
    rows = report.plan_rows(plan, ctx.args.budget_s)
    lines = report.plan_lines({"plan": rows, "budget_s": ctx.args.budget_s,
                               "plan_total_s": sum(r["estimate_s"] for r in rows if r["within_budget"])})  # fmt: skip
    for line in lines:
        ctx.say(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        check_arguments(args)
        ctx = make_context(args)
        plan = steps.plan(ctx)
        node_plan = steps.plan(dataclasses.replace(ctx, dry=False), strict=False)  # shown by a dry run too
    except UsageError as error:
        exit_with(error)
    ctx.out.mkdir(parents=True, exist_ok=True)
    ctx.log_file.write_text("")
    print_plan(ctx, node_plan)
    if args.plan_only:
        return 0
    raise_on_signals()
    ctx.work.mkdir(parents=True, exist_ok=True)
    try:
        result = run_steps(ctx, plan, node_plan)
    except Interrupted:
        return 143
    finally:
        if args.work_dir is None:
            shutil.rmtree(ctx.work, ignore_errors=True)
    for line in report.result_lines(result):
        ctx.say(line)
    ctx.say(f"wrote {ctx.out}: gpu_check.json, gpu_check.txt, gpu_check.log, details.tar.gz")
    if result["failed"]:
        print(f"gpu-check FAILED: {', '.join(result['failed'])} (logs in {ctx.out})", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
