"""`horovod-train bench allreduce`: Horovod's all-reduce against torch.distributed's, in the same processes.

Run it under a launcher (``horovodrun -np 2 --gloo ...``, ``mpirun -np 2 ...``; plain ``python`` is one
rank). Horovod is measured first, with whatever controller and ``HOROVOD_*`` settings the launch gave it
(they are read at ``hvd.init``, so a sweep needs one launch per setting: see ``bench allreduce-sweep``).
Then ``hvd.shutdown()`` stops Horovod's background thread and the same processes join a torch.distributed
process group (Gloo on CPU, NCCL on GPU) over a TCP store at rank 0's address, which rank 0 chose and
broadcast with Horovod. Measuring one after the other keeps Horovod's idle cycle out of torch's numbers.

Cases: single float32 tensors from --min_bytes to --max_bytes, and the gradient tensors of a model
(every trainable parameter's shape). Horovod's modes: ``async`` submits every tensor and then waits for
all, as ``hvd.DistributedOptimizer`` does, so tensor fusion applies; ``one_by_one`` waits for each call.
torch's: ``async`` (one ``all_reduce`` per tensor, all in flight) and ``bucketed`` (DDP's layout as the ddp
engine makes it, ``buckets.ddp_buckets``: 25 MiB flat buckets in reverse parameter order, reduced in place
as with ``gradient_as_bucket_view``). Time is the median over iterations of the slowest rank; algbw = bytes /
time and busbw = algbw x 2(n-1)/n, as nccl-tests defines them for all-reduce.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from horovod_train.bench import architectures, bandwidth, outputs, units
from horovod_train.bench.buckets import ddp_buckets
from horovod_train.common.errors import UsageError
from horovod_train.common.tables import format_table
from horovod_train.config import domains
from horovod_train.engines.ddp_options import DDPArguments
from horovod_train.launching.base import free_port, hostname

COLUMNS = [
    "label",
    "framework",
    "ops",
    "controller",
    "case",
    "mode",
    "tensors",
    "bytes",
    "world_size",
    "fusion_threshold",
    "cycle_time_ms",
    "cpu_operations",
    "iters",
    "time_us",
    "algbw_GBps",
    "busbw_GBps",
]
FRAMEWORKS = ("horovod", "torch")
HOROVOD_DEFAULTS = {"HOROVOD_FUSION_THRESHOLD": str(128 * 2**20), "HOROVOD_CYCLE_TIME": "1"}  # Horovod 0.28


@dataclass(frozen=True)
class Case:
    name: str  # "4KB", or a model name for its gradients
    kind: str  # "tensor" or "model"
    numels: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return 4 * sum(self.numels)  # float32


# A mode makes (the operation, the buffers it reduces in place) for a case's tensors.
Mode = Callable[[Case, list[torch.Tensor]], tuple[Callable[[], None], list[torch.Tensor]]]


def tensor_cases(min_bytes: int, max_bytes: int, factor: int) -> list[Case]:
    cases, size = [], min_bytes
    while size <= max_bytes:
        cases.append(Case(units.format_bytes(size), "tensor", (max(1, size // 4),)))
        size *= factor
    return cases


def model_case(name: str) -> Case:
    """The model's gradient tensors: one per trainable parameter, built on the meta device (no memory)."""
    from transformers import BertForSequenceClassification

    with torch.device("meta"):
        model = BertForSequenceClassification(architectures.bert_config(name))
    return Case(name, "model", tuple(p.numel() for p in model.parameters() if p.requires_grad))


def iterations(nbytes: int, args: argparse.Namespace) -> int:
    return max(args.min_iters, min(args.iters, math.ceil(args.budget_bytes / max(nbytes, 1))))


def time_op(op: Callable[[], None], iters: int, warmup: int, sync: Callable[[], None]) -> list[float]:
    for _ in range(warmup):
        op()
    sync()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        op()
        sync()
        times.append(time.perf_counter() - start)
    return times


def check_sum(op: Callable[[], None], tensors: list[torch.Tensor], rank: int, world: int) -> None:
    """One real all-reduce of (rank + 1) everywhere must give 1 + ... + world; then zeros, so repeated
    sums cannot overflow."""
    for t in tensors:
        t.fill_(rank + 1)
    op()
    expected = world * (world + 1) / 2
    if any(not torch.all(t == expected) for t in tensors):
        raise RuntimeError(f"all-reduce returned a wrong sum (expected {expected})")
    for t in tensors:
        t.zero_()


def measure(cases: list[Case], modes: dict[str, Mode], ctx: dict[str, Any], args: argparse.Namespace):
    """{(case, mode): per-iteration seconds on this rank} for every case and the modes of its kind."""
    device, rank, world, sync = ctx["device"], ctx["rank"], ctx["world"], ctx["sync"]
    times = {}
    for case in cases:
        tensors = [torch.zeros(n, dtype=torch.float32, device=device) for n in case.numels]
        for mode, make in modes.items():
            if mode.startswith(case.kind + ":"):
                op, buffers = make(case, tensors)
                check_sum(op, buffers, rank, world)
                n = iterations(case.nbytes, args)
                times[(case.name, mode.split(":", 1)[1])] = time_op(op, n, args.warmup, sync)
        del tensors
    return times


def horovod_modes(hvd: Any) -> dict[str, Mode]:
    """Each mode returns the operation and the buffers it reduces in place."""

    def one_by_one(case: Case, tensors: list[torch.Tensor]):
        def op() -> None:
            for i, t in enumerate(tensors):
                hvd.allreduce_(t, name=f"bench.{case.name}.{i}", op=hvd.Sum)

        return op, tensors

    def in_flight(case: Case, tensors: list[torch.Tensor]):
        def op() -> None:
            handles = [
                hvd.allreduce_async_(t, name=f"bench.{case.name}.{i}", op=hvd.Sum) for i, t in enumerate(tensors)
            ]
            for handle in handles:
                hvd.synchronize(handle)

        return op, tensors

    return {"tensor:single": one_by_one, "model:async": in_flight, "model:one_by_one": one_by_one}


def torch_modes(dist: Any) -> dict[str, Mode]:
    def in_flight(case: Case, tensors: list[torch.Tensor]):
        def op() -> None:
            for work in [dist.all_reduce(t, async_op=True) for t in tensors]:
                work.wait()

        return op, tensors

    def bucketed(case: Case, tensors: list[torch.Tensor]):
        # DDP with gradient_as_bucket_view: the gradients are views of flat buckets, reduced in place.
        sizes = ddp_buckets([4 * n for n in case.numels], DDPArguments.ddp_bucket_cap_mb)  # float32
        numels = [nbytes // 4 for _, nbytes in sizes]
        buckets = list(torch.zeros(sum(case.numels), device=tensors[0].device).split(numels))
        return in_flight(case, buckets)

    return {"tensor:single": in_flight, "model:async": in_flight, "model:bucketed": bucketed}


def horovod_settings(hvd: Any, cuda: bool) -> dict[str, Any]:
    controller = "mpi" if hvd.mpi_enabled() else "gloo"
    env = {k: os.environ.get(k, v) for k, v in HOROVOD_DEFAULTS.items()}
    cpu_ops = os.environ.get("HOROVOD_CPU_OPERATIONS", controller).lower()
    return {
        "framework": "horovod",
        "controller": controller,
        "ops": "nccl" if cuda and hvd.nccl_built() else cpu_ops,
        "cpu_operations": cpu_ops,
        "fusion_threshold": int(env["HOROVOD_FUSION_THRESHOLD"]),
        "cycle_time_ms": float(env["HOROVOD_CYCLE_TIME"]),
    }


def rows_from(times_per_rank: list[dict], cases: list[Case], settings: dict, world: int, label: str) -> list[dict]:
    by_name = {c.name: c for c in cases}
    rows = []
    for key in times_per_rank[0]:
        case = by_name[key[0]]
        slowest = [max(per_iter) for per_iter in zip(*(t[key] for t in times_per_rank), strict=True)]
        seconds = outputs.median(slowest)
        alg = bandwidth.algbw(case.nbytes, seconds)
        rows.append(
            {
                "label": label,
                **settings,
                "case": case.name,
                "kind": case.kind,
                "mode": key[1],
                "tensors": len(case.numels),
                "bytes": case.nbytes,
                "world_size": world,
                "iters": len(slowest),
                "time_us": round(seconds * 1e6, 3),
                "algbw_GBps": round(alg, 6),
                "busbw_GBps": round(bandwidth.busbw(alg, world), 6),
            }
        )
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output_dir", default="runs/bench/allreduce")
    parser.add_argument("--min_bytes", default="4KB", help="smallest single tensor (default 4KB)")
    parser.add_argument("--max_bytes", default=None, help="largest single tensor (default 64MB on CPU, 256MB on GPU)")
    parser.add_argument("--step_factor", type=int, default=2, help="size ratio between single-tensor cases")
    parser.add_argument(
        "--models",
        nargs="*",
        default=list(architectures.MODELS),
        help="gradient sets to all-reduce: tiny-bert, bert-base-cased (none: skip)",
    )
    parser.add_argument("--no_tensors", action="store_true", help="skip the single-tensor sizes")
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    parser.add_argument("--iters", type=int, default=50, help="most timed iterations per case")
    parser.add_argument("--min_iters", type=int, default=3, help="fewest timed iterations per case")
    parser.add_argument(
        "--budget", default=None, help="bytes reduced per case, which sets its iterations (512MB on CPU, 16GB on GPU)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations per case")
    parser.add_argument("--label", default="", help="tag every row (the sweep names its runs with it)")


def validate(args: argparse.Namespace, cuda: bool | None = None) -> list[Case]:
    """Every argument against its domain (nothing is launched or written before); the cases to measure."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    domains.check_environment(os.environ)  # the HOROVOD_* knobs it measures under, as train checks them
    domains.writable_dir("output_dir", args.output_dir)
    domains.text("label", args.label or None)
    args.max_bytes = args.max_bytes or ("256MB" if cuda else "64MB")
    args.budget_bytes = units.parse_bytes(args.budget or ("16GB" if cuda else "512MB"))
    lo, hi = units.parse_bytes(args.min_bytes), units.parse_bytes(args.max_bytes)
    if lo < 4 or hi < lo or args.step_factor < 2:
        raise UsageError(
            f"sizes {args.min_bytes}..{args.max_bytes} x{args.step_factor} are empty",
            "pass 4 <= --min_bytes <= --max_bytes and --step_factor >= 2",
        )
    if args.budget_bytes < 1:
        raise UsageError(f"--budget {args.budget} is no bytes", "pass e.g. --budget 512MB")
    if args.iters < 1 or args.min_iters < 1 or args.warmup < 0:
        raise UsageError("--iters and --min_iters must be >= 1 and --warmup >= 0", "pass e.g. --iters 20")
    unknown = [name for name in args.models if name not in architectures.MODELS]
    if unknown:
        raise UsageError(f"--models: unknown model(s) {', '.join(unknown)}", f"use {' or '.join(architectures.MODELS)}")
    cases = [] if args.no_tensors else tensor_cases(lo, hi, args.step_factor)
    cases += [model_case(name) for name in args.models]
    if not cases:
        raise UsageError("nothing to measure: --no_tensors and no --models", "drop --no_tensors or name a model")
    return cases


def run_torch(cases: list[Case], ctx: dict[str, Any], args: argparse.Namespace, address: tuple[str, int]):
    import torch.distributed as dist

    backend = "nccl" if ctx["device"].type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://{address[0]}:{address[1]}", rank=ctx["rank"], world_size=ctx["world"]
    )
    try:
        times = measure(cases, torch_modes(dist), ctx, args)
        gathered: list[Any] = [None] * ctx["world"]
        dist.all_gather_object(gathered, times)
    finally:
        dist.destroy_process_group()
    settings = {
        "framework": "torch",
        "controller": "",
        "ops": backend,
        "cpu_operations": "",
        "fusion_threshold": "",
        "cycle_time_ms": "",
    }
    return rows_from(gathered, cases, settings, ctx["world"], args.label)


def main(args: argparse.Namespace) -> int:
    import horovod.torch as hvd

    cuda = torch.cuda.is_available()
    cases = validate(args, cuda)
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    device = torch.device("cuda", hvd.local_rank()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    ctx = {"device": device, "rank": rank, "world": world, "sync": torch.cuda.synchronize if cuda else (lambda: None)}
    # torch.distributed's rendezvous: rank 0's address (loopback when every rank is on this host).
    here = os.environ.get("MASTER_ADDR") or ("127.0.0.1" if hvd.local_size() == world else hostname())
    address = hvd.broadcast_object((here, free_port()) if rank == 0 else None, root_rank=0, name="bench.address")
    rows = []
    if "horovod" in args.frameworks:
        times = measure(cases, horovod_modes(hvd), ctx, args)
        gathered = hvd.allgather_object(times, name="bench.times")
        rows += rows_from(gathered, cases, horovod_settings(hvd, cuda), world, args.label)
    hvd.shutdown()
    if "torch" in args.frameworks:
        rows += run_torch(cases, ctx, args, address)
    if rank == 0:
        out = Path(args.output_dir)
        outputs.write_rows(out, "allreduce", COLUMNS, rows, world_size=world, device=str(device))
        plot(rows, out / "allreduce.png")
        print("\n".join(format_table(TABLE[0], [table_row(r) for r in rows])))
        print(f"wrote {out}/: allreduce.csv, allreduce.json, allreduce.png")
        print("\n".join(conclusion(rows)))
    return 0


# Horovod's mode against torch's for each kind of case: one tensor each way; a model's gradients as each engine
# reduces them in training (hvd.DistributedOptimizer's calls all in flight, fused; DDP's buckets).
COMPARED_MODES = {"tensor": ("single", "single"), "model": ("async", "bucketed")}


@dataclass(frozen=True)
class LatencyBandwidth:
    """time = latency + bytes / bandwidth, a least-squares line through a framework's single-tensor times."""

    latency_us: float
    bandwidth_GBps: float  # noqa: N815 (GB/s, as the table's columns)

    @classmethod
    def fit(cls, rows: list[dict[str, Any]]) -> LatencyBandwidth | None:
        """None with fewer than two sizes. Times that do not grow with the size (small tensors on a loaded machine:
        one slow call of the smallest was the first one's cycle) are all fixed cost: their mean, infinite bandwidth."""
        sizes = [float(r["bytes"]) for r in rows]
        times = [float(r["time_us"]) for r in rows]
        if len(set(sizes)) < 2:
            return None
        mean_size, mean_time = sum(sizes) / len(sizes), sum(times) / len(times)
        spread = sum((x - mean_size) ** 2 for x in sizes)
        us_per_byte = sum((x - mean_size) * (y - mean_time) for x, y in zip(sizes, times, strict=True)) / spread
        if us_per_byte <= 0:
            return cls(mean_time, math.inf)
        return cls(max(0.0, mean_time - mean_size * us_per_byte), 1e-3 / us_per_byte)

    def bandwidth_us(self, nbytes: int) -> float:
        return nbytes / (self.bandwidth_GBps * 1e3)


def conclusion(rows: list[dict[str, Any]]) -> list[str]:
    """Below the table, as bench train ends: Horovod/torch time ratios, and what the largest gap comes from, read
    off the numbers: a latency + bytes/bandwidth line through each framework's single-tensor times says whether
    the gap is in the fixed cost of a call (small tensors) or in the bandwidth (large ones)."""
    pairs = []  # (case, its kind, bytes, Horovod's row, torch's row)
    for kind, (horovod_mode, torch_mode) in COMPARED_MODES.items():
        found = {
            (r["framework"], r["case"]): r
            for r in rows
            if r["kind"] == kind and r["mode"] == (horovod_mode if r["framework"] == "horovod" else torch_mode)
        }
        both = [
            (case, r) for (framework, case), r in found.items() if framework == "horovod" and ("torch", case) in found
        ]
        pairs += [(case, kind, r["bytes"], r, found[("torch", case)]) for case, r in both]
    if not pairs:
        return []
    ratio = {case: h["time_us"] / t["time_us"] for case, _, _, h, t in pairs}
    lines = []
    tensors = [p for p in pairs if p[1] == "tensor"]
    if tensors:
        each = ", ".join(f"{case} {ratio[case]:.2f}x" for case, *_ in tensors)
        lines.append(f"==> Horovod/torch time, one tensor (>1: Horovod slower): {each}")
    for case, _, _, h, t in (p for p in pairs if p[1] == "model"):
        lines.append(
            f"==> Horovod/torch time, {case}'s gradients (Horovod {h['mode']}, torch {t['mode']}): "
            f"{ratio[case]:.2f}x, {h['time_us'] / 1e3:.2f} ms vs {t['time_us'] / 1e3:.2f} ms"
        )
    case, kind, nbytes, h, t = max(pairs, key=lambda p: max(ratio[p[0]], 1 / ratio[p[0]]))
    slower, faster = (h, t) if ratio[case] >= 1 else (t, h)
    gap = max(ratio[case], 1 / ratio[case])
    lines.append(
        f"==> largest gap: {case} ({kind}), {slower['framework']} {slower['time_us']:.0f} us vs "
        f"{faster['framework']} {faster['time_us']:.0f} us ({gap:.2f}x)"
    )
    fits = {
        name: LatencyBandwidth.fit(
            [r for r in rows if r["framework"] == name and r["kind"] == "tensor" and r["mode"] == "single"]
        )
        for name in FRAMEWORKS
    }
    if len(tensors) >= 2 and all(fits.values()):
        lines.append(gap_reason(fits, nbytes, slower, faster))
    return lines


def gap_reason(fits: dict[str, LatencyBandwidth], nbytes: int, slower: dict, faster: dict) -> str:
    """Why ``slower`` takes longer at ``nbytes``: the fixed cost or the bandwidth, whichever of the two lines'
    differences is the larger there."""
    slow, fast = fits[slower["framework"]], fits[faster["framework"]]
    fixed = slow.latency_us - fast.latency_us
    transfer = slow.bandwidth_us(nbytes) - fast.bandwidth_us(nbytes)
    lines = (
        f"fixed cost per call {slow.latency_us:.0f} us vs {fast.latency_us:.0f} us, bandwidth "
        f"{slow.bandwidth_GBps:.2f} vs {fast.bandwidth_GBps:.2f} GB/s (a least-squares line through the single-tensor "
        f"times)"
    )
    if fixed >= transfer:
        size = units.format_bytes(nbytes)
        why = f"==> why: latency-bound: {lines}; at {size} {fixed:.0f} us of the gap is the fixed cost"
        cycle_ms = slower.get("cycle_time_ms") if slower["framework"] == "horovod" else None
        if cycle_ms:  # what Horovod adds to every call: a tensor waits for its background thread's next cycle
            why += (
                f", {fixed / (cycle_ms * 1e3):.1f}x HOROVOD_CYCLE_TIME ({cycle_ms:g} ms): each request waits "
                "for the background thread's next cycle and the ranks' negotiation before it is reduced"
            )
        return why
    return (
        f"==> why: bandwidth-bound: {lines}; at {units.format_bytes(nbytes)} {transfer:.0f} us of the gap is "
        f"moving the bytes"
    )


TABLE = (["framework", "ops", "case", "mode", "tensors", "size", "time (us)", "algbw GB/s", "busbw GB/s"],)


def table_row(r: dict[str, Any]) -> list[str]:
    return [
        r["framework"],
        r["ops"],
        r["case"],
        r["mode"],
        str(r["tensors"]),
        units.format_bytes(r["bytes"]),
        f"{r['time_us']:.1f}",
        f"{r['algbw_GBps']:.3f}",
        f"{r['busbw_GBps']:.3f}",
    ]


def series_name(r: dict[str, Any]) -> str:
    return f"{r['framework']}-{r['ops']} {r['mode']}" + (f" [{r['label']}]" if r["label"] else "")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = outputs.pyplot()
    tensors = [r for r in rows if r["kind"] == "tensor"]
    models = [r for r in rows if r["kind"] == "model"]
    panels = [p for p in (tensors, models) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    axes = list(axes[0])
    if tensors:
        ax = axes.pop(0)
        for name in dict.fromkeys(series_name(r) for r in tensors):
            points = [r for r in tensors if series_name(r) == name]
            ax.plot([r["bytes"] for r in points], [r["busbw_GBps"] for r in points], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tensor size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"all-reduce of one tensor, {tensors[0]['world_size']} ranks")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    if models:
        ax = axes.pop(0)
        names = [f"{r['case']}: {series_name(r)}" for r in models]
        bars = ax.barh(names, [r["time_us"] / 1e3 for r in models], color="tab:blue")
        ax.bar_label(bars, fmt="%.1f", padding=2, fontsize=8)
        ax.set_xlabel("time per all-reduce of every gradient (ms)")
        ax.set_title("model gradients")
        ax.invert_yaxis()
        ax.margins(x=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
