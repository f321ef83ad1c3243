"""Horovod's knobs that live in the environment, and a gentler wait for its all-reduces on CPUs.

Horovod reads HOROVOD_TIMELINE, HOROVOD_AUTOTUNE, HOROVOD_CYCLE_TIME, ... once, in ``hvd.init``, so the
engine sets them just before it. ``--horovod_timeline`` and ``--autotune`` work the same under any launcher
(horovodrun's ``--timeline-filename`` and ``--autotune`` set the same variables). On CPUs, defaults
measured on the embedded job (docs/performance.md) are added where the user has not set the variable.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from horovod_train.common.errors import UsageError
from horovod_train.engines.horovod.options import HorovodArguments

if TYPE_CHECKING:
    import torch

# Measured on the embedded job, 2 ranks on 2 cores (docs/performance.md). Only where unset. Under mpirun
# (the MPI controller, Horovod's fastest on CPU: shared-memory transport), the ranks' MPI reads this at
# MPI_Init, inside hvd.init: its progress engine yields the core instead of busy-polling it.
CPU_DEFAULTS: dict[str, str] = {"OMPI_MCA_mpi_yield_when_idle": "1"}
POLL_INTERVAL_S = 1e-4
# A rank that stops submitting tensors (a hang, not a crash: launchers end a job whose rank died) makes
# the others warn after 60 s and shut the job down after --ddp_timeout (default 30 minutes) instead of
# waiting forever: long enough for one-sided work (local rank 0 tokenizing, rank 0 writing a checkpoint
# of several GB to a parallel file system) while the others wait.
STALL_WARNING_S = "60"
# The gradient buckets' cap on CPUs (--horovod_group_mb; issue 23, docs/performance.md).
CPU_GROUP_MB = 4.0


def apply(args: HorovodArguments, cuda: bool, timeout_s: int = 1800) -> dict[str, str]:
    """Set the variables the run's arguments ask for, then the CPU defaults the user has not set."""
    wanted: dict[str, str] = {}
    if args.horovod_timeline:
        timeline = Path(args.horovod_timeline).resolve()
        timeline.parent.mkdir(parents=True, exist_ok=True)
        wanted["HOROVOD_TIMELINE"] = str(timeline)  # written by rank 0 only
    if args.autotune:
        wanted["HOROVOD_AUTOTUNE"] = "1"
        if args.autotune_log:
            log = Path(args.autotune_log).resolve()
            log.parent.mkdir(parents=True, exist_ok=True)
            wanted["HOROVOD_AUTOTUNE_LOG"] = str(log)
    defaults = {
        "HOROVOD_STALL_CHECK_TIME_SECONDS": STALL_WARNING_S,
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(timeout_s),
        **({} if cuda else CPU_DEFAULTS),
    }
    wanted.update({k: v for k, v in defaults.items() if k not in os.environ})
    os.environ.update(wanted)
    return wanted


def optimizer_groups(
    args: HorovodArguments, cuda: bool, parameters: Sequence[torch.Tensor] = ()
) -> int | list[list[torch.Tensor]] | None:
    """hvd.DistributedOptimizer's ``groups``: --horovod_groups (0 means None, per tensor), else on CPU the
    trained parameters in buckets of --horovod_group_mb (default CPU_GROUP_MB), and None (per tensor,
    overlapping the backward pass) on GPUs, in elastic runs and with --gradient_predivide_factor (Horovod
    0.28.1's grouped all-reduce drops it).

    A bucket is all-reduced, fused, as soon as its last gradient is ready, so a large model's all-reduce
    overlaps the rest of the backward pass as DDP's buckets do, and a small model's gradients (tiny-bert's
    2.2 MB) make one all-reduce per step instead of one per 1 ms cycle (docs/performance.md)."""
    if args.horovod_groups is not None:
        return args.horovod_groups or None
    if cuda or args.elastic or args.gradient_predivide_factor != 1.0:
        return None
    cap_mb = args.horovod_group_mb if args.horovod_group_mb is not None else CPU_GROUP_MB
    return gradient_buckets(parameters, int(cap_mb * 2**20))


def gradient_buckets(parameters: Sequence[torch.Tensor], cap_bytes: int) -> list[list[torch.Tensor]]:
    """The parameters in reverse order (roughly the order backward produces their gradients), in consecutive
    buckets of at most ``cap_bytes`` (a larger tensor alone in its own), as DDP forms its buckets."""
    buckets: list[list[torch.Tensor]] = [[]]
    size = 0
    for p in reversed(list(parameters)):
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and size + nbytes > cap_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return [b for b in buckets if b]


def check_groups(args: HorovodArguments) -> None:
    """Horovod 0.28.1's grouped all-reduce passes no pre/postscale factors: with --horovod_groups or
    --horovod_group_mb the --gradient_predivide_factor would be silently ignored."""
    flag = args.grouping_flag()
    if flag and args.gradient_predivide_factor != 1.0:
        raise UsageError(
            f"--gradient_predivide_factor has no effect with {flag} (Horovod's grouped all-reduce drops it)",
            "drop one of them (--horovod_groups 0 all-reduces per tensor and applies the factor)",
        )


def nccl_warning(hvd: Any, cuda: bool) -> str | None:
    """A Horovod built without NCCL all-reduces CUDA tensors by copying them through the host."""
    if cuda and not hvd.nccl_built():
        return (
            "warning: this Horovod was built without NCCL: GPU tensors are all-reduced through the CPU "
            "(slow); rebuild it on this machine with a CUDA torch (scripts/build_horovod.sh sets "
            "HOROVOD_GPU_OPERATIONS=NCCL)"
        )
    return None


def wait_politely(hvd: Any, optimizer: Any) -> None:
    """Sleep-poll the optimizer's pending all-reduces before it synchronizes.

    ``hvd.synchronize`` spins (``std::this_thread::yield``) until a handle completes; on a CPU whose
    cores the ranks share, the spinning thread takes cycles from Horovod's background thread, which is
    the one doing the all-reduce. After this returns, ``synchronize`` finds every handle done."""
    for handle, _ in list(getattr(optimizer, "_handles", {}).values()):
        if isinstance(handle, int):
            poll_until_done(hvd, handle)


def poll_until_done(hvd: Any, handle: int, longest_sleep_s: float = POLL_INTERVAL_S) -> None:
    """Return once Horovod's operation ``handle`` is complete, sleeping between polls instead of spinning.

    The sleeps grow from POLL_INTERVAL_S to ``longest_sleep_s``: the gradients' wait (a few ms, on the step's
    critical path) keeps the shortest; the engine's other collectives, which wait seconds while rank 0 writes a
    checkpoint or builds the tokenizer, sleep up to milliseconds (a 5 s wait: 0.4 s of CPU, 4.9 s spinning)."""
    if os.environ.get("HOROVOD_TRAIN_SPIN_WAIT") == "1":  # Horovod's own wait, for comparisons
        return
    sleep = POLL_INTERVAL_S
    while not hvd.poll(handle):
        time.sleep(sleep)
        sleep = min(2 * sleep, longest_sleep_s)
