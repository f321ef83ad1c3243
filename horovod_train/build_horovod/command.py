"""`horovod-train build-horovod` (and `python -m horovod_train.build_horovod`, which scripts/build_horovod.sh runs)."""

from __future__ import annotations

import argparse

from horovod_train.build_horovod import build, install
from horovod_train.build_horovod.plan import Options, Plan, make_plan, missing_error, with_build_tools
from horovod_train.build_horovod.target import running_target
from horovod_train.common.console import write_line
from horovod_train.common.errors import UsageError, exit_with

DESCRIPTION = (
    "Build Horovod 0.28.1 from its sdist against this environment's torch (CPU or CUDA; NCCL when torch is a "
    "CUDA build and NCCL is found, MPI when mpicxx is, Gloo always), patched for torch >= 2.1 (C++17), cache the "
    "wheel per (torch, Python, CUDA, architectures) in ~/.cache/horovod-train/wheels (HOROVOD_TRAIN_CACHE, "
    "HOROVOD_WHEEL_CACHE), install it with pip and print `horovodrun --check-build`."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.add_argument("--force", action="store_true", help="rebuild even when a cached wheel or install fits")
    parser.add_argument("--dry-run", "--print-plan", dest="dry_run", action="store_true",
                        help="print what would be built (torch, CUDA, NCCL, MPI, cache key) and stop")  # fmt: skip
    for name, what in (("nccl", "NCCL (default: when torch is a CUDA build and NCCL is found)"),
                       ("mpi", "MPI (default: when mpicxx is on PATH)")):  # fmt: skip
        group = parser.add_mutually_exclusive_group()
        group.add_argument(f"--with-{name}", dest=name, action="store_true", default=None, help=f"build with {what}")
        group.add_argument(f"--without-{name}", dest=name, action="store_false", help=f"build without {name.upper()}")
    parser.add_argument("--cuda-archs", help="GPU architectures, e.g. 90 or 80,90 (default on CUDA >= 13: "
                        "75,80,86,89,90,100,120; HOROVOD_BUILD_CUDA_CC_LIST)")  # fmt: skip
    parser.add_argument("--jobs", type=int, help="parallel compile jobs (default: HOROVOD_BUILD_JOBS, else all cores)")
    parser.add_argument("--debug-info", action="store_true",
                        help="keep Horovod's RelWithDebInfo build (-g, for gdb; a wheel 18x larger, a build 40%% "
                             "longer) instead of Release")  # fmt: skip


def options_from(args: argparse.Namespace) -> Options:
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}", "give a positive number of compile jobs")
    return Options(force=args.force, dry_run=args.dry_run, nccl=args.nccl, mpi=args.mpi,
                   cuda_archs=args.cuda_archs, jobs=args.jobs, debug_info=args.debug_info)  # fmt: skip


def next_step(plan: Plan, options: Options) -> str:
    if options.force:
        return "build (--force)"
    if install.already_installed(plan):
        return "nothing to build: already installed"
    wheel = install.cached_wheel(plan)
    return f"install the cached wheel {wheel}" if wheel else "build (no cached wheel), then install"


def print_plan(plan: Plan, step: str) -> None:
    for line in plan.describe():
        write_line(f"[horovod] {line}")
    write_line(f"[horovod] next:       {step}")


def main(args: argparse.Namespace) -> int:
    options = options_from(args)
    plan = make_plan(running_target(), options, collect=True)
    # what the cache key depends on missing (MPI's headers, CUDA): no wheel to look for, a build to plan
    step = next_step(plan, options) if not plan.missing else "build, once what is missing is there"
    if step.startswith("nothing") and not options.dry_run and not plan.missing:
        write_line(install.installed_line(plan))  # already_installed checked what --check-build would
        return 0
    if step.startswith("build"):
        with_build_tools(plan, collect=True)
    print_plan(plan, step)  # with what is missing marked (a dry run shows it), then one error naming all of it
    if plan.missing:
        raise missing_error(plan)
    if options.dry_run:
        return 0
    with build.cache_lock(plan):
        wheel = None if options.force else install.cached_wheel(plan)
        if wheel is None:
            build.build_wheel(plan, options)
            wheel = install.cached_wheel(plan)
        assert wheel is not None, plan.wheel_dir
        install.install_wheel(plan, wheel)
    install.check_build(plan)
    write_line(f"[horovod] {plan.version} installed for {plan.target.python}")
    return 0


def run_standalone(argv: list[str]) -> int:
    """Without the CLI's imports (transformers, datasets): an environment with torch alone can run it."""
    parser = argparse.ArgumentParser(prog="python -m horovod_train.build_horovod")
    add_arguments(parser)
    try:
        return main(parser.parse_args(argv))
    except UsageError as error:
        exit_with(error)
    return 0
