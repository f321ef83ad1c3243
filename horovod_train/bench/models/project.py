"""`horovod-train bench project`: an alpha-beta model of data-parallel step time from 1 to 1024 GPUs.

Per step, every GPU computes its batch (``compute``: forward + backward, measured or given), and the
gradients are all-reduced in buckets while the backward pass still runs. The model:

- gradients: one tensor per trainable parameter (a BERT config built on the meta device, as
  ``bench allreduce`` does, or a CNN's published layer sizes), float32 unless told otherwise;
  backward produces them in reverse order, each tensor after an equal share of the backward time;
- buckets: DDP's fixed buckets (``--ddp_bucket_cap_mb``, as the ddp engine passes it: ``buckets.ddp_buckets``)
  launched when their last gradient is ready; Horovod's background thread wakes every ``--cycle_time_ms``
  and fuses what is ready, up to ``--fusion_threshold_mb`` per operation;
- one communication stream: bucket k starts when it is ready and bucket k-1 is done;
- ring all-reduce of S bytes over n ranks on a link of bandwidth B and latency alpha:
  ``2(n-1)/n * S/B + 2(n-1) * alpha``; across nodes with several GPUs per node, hierarchical:
  reduce-scatter in the node, a ring between the nodes on S/G per GPU (the G rings share the node's
  NIC, so the NIC carries 2(M-1)/M * S), all-gather in the node;
- step = compute + what of the communication is still running after backward ends.

The sharded schedules (each a ring collective of half an all-reduce's cost: ``AG(S) = RS(S) = allreduce(S) / 2``):

- buckets gathered after the step (zero1): DDP's buckets, then, after the optimizer step, an all-gather of the
  updated parameters (each rank stepped its share), which nothing overlaps;
- per block (fsdp): the parameters in ``--fsdp_units`` units (transformer blocks: contiguous runs of tensors of
  about equal bytes); forward all-gathers each unit, the next one prefetched while the current one computes;
  backward all-gathers each again (ZeRO-3; the zero2 variant keeps them from forward) and reduce-scatters its
  gradients after its backward. One link: the collectives run one after another in the order they are issued.

Which engine runs which schedule is its row's communication part (engines/communication.py): every row with one,
and each of its variants that changes it, is a setting here (bench/engine_names.py's ``communications``).

Scaling is weak (fixed batch per GPU): samples/s = N x batch / step and efficiency = step(1) / step(N).
``--check_published`` predicts the published Horovod runs from their stated hardware (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from horovod_train.bench import buckets, outputs
from horovod_train.bench.bandwidth import GB as GBPS  # GB/s, as bench allreduce reports them
from horovod_train.bench.engine_names import communications, reference_engine
from horovod_train.bench.units import format_bytes
from horovod_train.common.errors import UsageError
from horovod_train.common.tables import format_table
from horovod_train.config import domains
from horovod_train.engines.communication import Buckets, Communication, FusionCycle, PerBlock
from horovod_train.engines.ddp_options import DDPArguments

MB = 2**20
COLUMNS = [
    "setting",
    "model",
    "world_size",
    "nodes",
    "gpus_per_node",
    "algorithm",
    "buckets",
    "gradient_bytes",
    "compute_ms",
    "comm_ms",
    "exposed_comm_ms",
    "step_ms",
    "samples_per_second",
    "scaling_efficiency",
]


@dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes/s
    latency: float  # seconds per ring step


@dataclass(frozen=True)
class Cluster:
    gpus_per_node: int
    intra: Link
    inter: Link
    algorithm: str = "auto"  # auto: hierarchical across nodes when a node has several GPUs


@dataclass(frozen=True)
class Setting:
    name: str
    communication: Communication  # the schedule: a fusion cycle, buckets (gathered after the step), per block
    bucket_bytes: int  # the fusion cycle's threshold, or the buckets' cap
    cycle_time: float = 0.0  # seconds between the fusion cycle's rounds
    overlap: bool = True  # communication starts during backward (per block: the next unit's all-gather is prefetched)
    units: int = 12  # per block: units the parameters are sharded in (the transformer blocks)

    @property
    def bucket_mb(self) -> float:
        return self.bucket_bytes / MB


@dataclass(frozen=True)
class Workload:
    model: str
    tensor_bytes: tuple[int, ...]  # in parameter (forward) order
    compute: float  # seconds per step on one GPU, forward + backward + update
    batch: int  # samples per GPU per step
    backward_fraction: float = 2 / 3  # backward is about twice the forward's FLOPs


def ring_allreduce_time(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce: 2(n-1) steps, each moving S/n bytes and paying one latency."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bandwidth + 2 * (n - 1) * link.latency


def hierarchical_allreduce_time(nbytes: float, nodes: int, per_node: int, intra: Link, inter: Link) -> float:
    """Reduce-scatter in the node, all-reduce of S/G per GPU between nodes (G rings share the NIC), all-gather."""
    in_node = (per_node - 1) / per_node * nbytes / intra.bandwidth + (per_node - 1) * intra.latency
    between = 2 * (nodes - 1) / nodes * nbytes / inter.bandwidth + 2 * (nodes - 1) * inter.latency if nodes > 1 else 0
    return 2 * in_node + between


def layout(world: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of ``world`` GPUs packed onto nodes of ``gpus_per_node``."""
    per_node = min(world, gpus_per_node)
    if world % per_node:
        raise UsageError(f"{world} GPUs do not fill nodes of {gpus_per_node}", "use multiples of --gpus_per_node")
    return world // per_node, per_node


def algorithm_for(world: int, cluster: Cluster) -> str:
    nodes, per_node = layout(world, cluster.gpus_per_node)
    if world == 1:
        return "none"
    if cluster.algorithm != "auto":
        return cluster.algorithm
    return "hierarchical" if nodes > 1 and per_node > 1 else "ring"


def allreduce_time(nbytes: float, world: int, cluster: Cluster) -> float:
    nodes, per_node = layout(world, cluster.gpus_per_node)
    algorithm = algorithm_for(world, cluster)
    if algorithm == "none":
        return 0.0
    if algorithm == "hierarchical" and nodes > 1:
        return hierarchical_allreduce_time(nbytes, nodes, per_node, cluster.intra, cluster.inter)
    # A flat ring spanning nodes waits, at every step, on its slowest hop: the inter-node one.
    return ring_allreduce_time(nbytes, world, cluster.inter if nodes > 1 else cluster.intra)


def ready_times(workload: Workload) -> list[float]:
    """When each gradient (in backward order) is ready, from the start of backward."""
    backward, count = workload.compute * workload.backward_fraction, len(workload.tensor_bytes)
    return [backward * (i + 1) / count for i in range(count)]


def ddp_buckets(workload: Workload, setting: Setting) -> list[tuple[float, int]]:
    """(launch time, bytes): DDP's buckets (buckets.ddp_buckets), launched when their last gradient is ready."""
    ready = ready_times(workload)
    return [(ready[last], nbytes) for last, nbytes in buckets.ddp_buckets(workload.tensor_bytes, setting.bucket_mb)]


def horovod_buckets(workload: Workload, setting: Setting) -> list[tuple[float, int]]:
    """(launch time, bytes): at each cycle tick, what became ready since, fused up to the threshold."""
    rounds: dict[int, list[int]] = {}
    for ready, nbytes in zip(ready_times(workload), reversed(workload.tensor_bytes), strict=True):
        tick = math.ceil(ready / setting.cycle_time) if setting.cycle_time > 0 else 0
        rounds.setdefault(tick, []).append(nbytes)
    buckets = []
    for tick, sizes in rounds.items():
        launch = tick * setting.cycle_time if setting.cycle_time > 0 else ready_times(workload)[-1]
        size = 0
        for nbytes in sizes:
            if size and size + nbytes > setting.bucket_bytes:
                buckets.append((launch, size))
                size = 0
            size += nbytes
        buckets.append((launch, size))
    return buckets


def units(tensor_bytes: tuple[int, ...], count: int) -> list[int]:
    """Bytes of each of ``count`` units: contiguous runs of tensors (forward order), cut where the running total
    passes each k/count of the whole (fewer units if there are fewer tensors)."""
    total, cuts, run, sizes = sum(tensor_bytes), 1, 0, []
    for nbytes in tensor_bytes:
        run += nbytes
        if run * count >= cuts * total and len(sizes) < count - 1:
            sizes.append(run - sum(sizes))
            cuts += 1
    rest = total - sum(sizes)
    return [*sizes, rest] if rest or not sizes else sizes


def fsdp_step(workload: Workload, setting: Setting, world: int, cluster: Cluster) -> dict[str, Any]:
    """FSDP's step: per unit, all-gather before forward (and before backward when resharding), reduce-scatter
    after backward. A unit's compute waits for its gather; the next unit's gather is issued when a unit starts
    (prefetch); one link runs the collectives in the order they are issued. Without overlap nothing hides."""
    sizes = units(workload.tensor_bytes, setting.units)
    gather = [allreduce_time(s, world, cluster) / 2 for s in sizes]  # all-gather = reduce-scatter = half
    reshard = isinstance(setting.communication, PerBlock) and setting.communication.reshard
    busy = sum(gather) * (3 if reshard else 2)
    if not setting.overlap or world == 1:
        return {"buckets": len(sizes), "comm": busy, "exposed": busy, "step": workload.compute + busy}
    backward = workload.compute * workload.backward_fraction
    forward_each, backward_each = (workload.compute - backward) / len(sizes), backward / len(sizes)
    link = compute = started = 0.0
    for cost in gather:  # forward: the gather of the next unit was issued when this one started
        link = max(link, started) + cost
        started = max(compute, link)
        compute = started + forward_each
    ready: dict[int, float] = {}  # when each unit's backward all-gather is done
    if reshard:  # the last unit's gather is issued when backward starts
        link = ready[len(sizes) - 1] = max(link, compute) + gather[-1]
    for unit in reversed(range(len(sizes))):
        started = max(compute, ready.get(unit, 0.0))
        if reshard and unit > 0:  # prefetch the previous unit's parameters
            link = ready[unit - 1] = max(link, started) + gather[unit - 1]
        compute = started + backward_each
        link = max(link, compute) + gather[unit]  # reduce-scatter this unit's gradients
    exposed = max(compute, link) - workload.compute
    return {"buckets": len(sizes), "comm": busy, "exposed": exposed, "step": workload.compute + exposed}


def step(workload: Workload, setting: Setting, world: int, cluster: Cluster) -> dict[str, Any]:
    """One step's times (seconds) on ``world`` GPUs."""
    communication = setting.communication
    if isinstance(communication, PerBlock):
        return fsdp_step(workload, setting, world, cluster)
    backward_end = workload.compute * workload.backward_fraction
    make = horovod_buckets if isinstance(communication, FusionCycle) else ddp_buckets
    buckets = make(workload, setting)
    done, busy = 0.0, 0.0
    for launch, nbytes in buckets:
        cost = allreduce_time(nbytes, world, cluster)
        start = max(launch if setting.overlap else backward_end, done)
        done, busy = start + cost, busy + cost
    exposed = max(0.0, done - backward_end) if world > 1 else 0.0
    if isinstance(communication, Buckets) and communication.gather_after_step:  # each rank's updated share
        gathered = allreduce_time(sum(workload.tensor_bytes), world, cluster) / 2
        busy, exposed = busy + gathered, exposed + gathered
    return {"buckets": len(buckets), "comm": busy, "exposed": exposed, "step": workload.compute + exposed}


def project(workload: Workload, settings: list[Setting], cluster: Cluster, worlds: list[int]) -> list[dict[str, Any]]:
    rows = []
    for setting in settings:
        base = step(workload, setting, 1, cluster)["step"]
        for world in worlds:
            nodes, per_node = layout(world, cluster.gpus_per_node)
            times = step(workload, setting, world, cluster)
            rows.append(
                {
                    "setting": setting.name,
                    "model": workload.model,
                    "world_size": world,
                    "nodes": nodes,
                    "gpus_per_node": per_node,
                    "algorithm": algorithm_for(world, cluster),
                    "buckets": times["buckets"],
                    "gradient_bytes": sum(workload.tensor_bytes),
                    "compute_ms": round(workload.compute * 1e3, 4),
                    "comm_ms": round(times["comm"] * 1e3, 4),
                    "exposed_comm_ms": round(times["exposed"] * 1e3, 4),
                    "step_ms": round(times["step"] * 1e3, 4),
                    "samples_per_second": world * workload.batch / times["step"],
                    "scaling_efficiency": base / times["step"],
                }
            )
    return rows


def setting(name: str, communication: Communication, args: argparse.Namespace) -> Setting:
    """The run ``name`` with the sizes of its schedule that ``args`` give."""
    overlap = not args.no_overlap
    if isinstance(communication, FusionCycle):
        threshold, cycle_time = int(args.fusion_threshold_mb * MB), args.cycle_time_ms / 1e3
        return Setting(name, communication, threshold, cycle_time=cycle_time, overlap=overlap)
    if isinstance(communication, PerBlock):
        return Setting(name, communication, 0, overlap=overlap, units=args.fsdp_units)
    return Setting(name, communication, int(args.ddp_bucket_cap_mb * MB), overlap=overlap)


def settings(args: argparse.Namespace) -> list[Setting]:
    every = communications()
    return [setting(name, every[name], args) for name in args.engines]


def lora_workload(args: argparse.Namespace, full: Workload) -> Workload:
    """LoRA's step: its trainable tensors' gradients, and no weight gradients for the frozen layers, so
    backward does about half its full-fine-tuning work (the input gradients): compute x (1 - backward/2)."""
    from horovod_train.bench.models import layers

    sizes = tuple(args.bytes_per_param * n for n in layers.parameter_counts(args.model, args.lora_r))
    compute = full.compute * (1 - full.backward_fraction / 2)
    backward = full.backward_fraction / 2 / (1 - full.backward_fraction / 2)
    return Workload(f"{full.model}+lora-r{args.lora_r}", sizes, compute, full.batch, backward)


def side_by_side(full: list[dict[str, Any]], lora: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """GPUs x engine: gradient bytes, exposed communication and scaling efficiency, full vs LoRA."""
    header = ["setting", "GPUs", "gradients full", "gradients LoRA", "exposed ms full", "exposed ms LoRA",
              "eff. full", "eff. LoRA"]  # fmt: skip
    body = [
        [f["setting"], str(f["world_size"]), format_bytes(f["gradient_bytes"]),
         format_bytes(g["gradient_bytes"]), f"{f['exposed_comm_ms']:.1f}", f"{g['exposed_comm_ms']:.1f}",
         f"{f['scaling_efficiency']:.3f}", f"{g['scaling_efficiency']:.3f}"]
        for f, g in zip(full, lora, strict=True)
    ]  # fmt: skip
    return header, body


def fit_link(path: Path) -> tuple[Link, int]:
    """Latency and bandwidth from `bench allreduce`'s single-tensor rows: least squares of
    time = 2(n-1) alpha + 2(n-1)/n x bytes / B over the sizes (the fastest framework per size)."""
    n, best = tensor_times(path)
    if n < 2:
        raise UsageError(
            f"--link_from {path} was measured on {n} rank: one rank sends nothing, so it has no link to fit",
            "run bench allreduce on 2 or more ranks (e.g. horovodrun -np 2 python -m horovod_train bench allreduce)",
        )
    if len(best) < 2:
        raise UsageError(
            f"--link_from {path} times one message size ({format_bytes(next(iter(best)))}): a latency and "
            "a bandwidth need two",
            "run bench allreduce over several sizes (its default: --min_bytes 4KB to --max_bytes 64MB)",
        )
    xs, ys = list(best), list(best.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    if slope <= 0:
        raise UsageError(
            f"--link_from {path}: larger messages were no slower than smaller ones (the fit's bandwidth would be "
            f"{'infinite' if slope == 0 else 'negative'}), so its times are noise, not the link",
            "rerun bench allreduce with a larger --max_bytes and more --iters, or pass --intra_gbps instead",
        )
    intercept = max(my - slope * mx, 0.0)
    return Link(2 * (n - 1) / n / slope, intercept / (2 * (n - 1))), n


def tensor_times(path: Path) -> tuple[int, dict[int, float]]:
    """(ranks, {bytes: fastest seconds}) of a `bench allreduce` report's single-tensor rows."""
    report = read_report(path, "link_from")
    rows = [r for r in report["rows"] if isinstance(r, dict) and r.get("kind") == "tensor"]
    if not rows:
        raise UsageError(f"{path} has no single-tensor rows", "run bench allreduce without --no_tensors")
    best: dict[int, float] = {}
    for i, row in enumerate(rows, 1):
        for key in ("world_size", "bytes", "time_us"):
            value = row.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise UsageError(
                    f"--link_from {path}: single-tensor row {i} has {key} {value!r}, not a positive number",
                    "pass the allreduce.json bench allreduce wrote, unedited",
                )
        best[row["bytes"]] = min(best.get(row["bytes"], math.inf), row["time_us"] / 1e6)
    worlds = sorted({int(r["world_size"]) for r in rows})
    if len(worlds) > 1:
        raise UsageError(
            f"--link_from {path} mixes rows of {' and '.join(map(str, worlds))} ranks",
            "pass one run's allreduce.json",
        )
    return worlds[0], best


def compute_from(path: Path) -> tuple[float, int]:
    """(seconds per step, batch per GPU) of the single-process run of `bench train`."""
    report = read_report(path, "compute_from")
    rows = [r for r in report["rows"] if isinstance(r, dict)]
    single = next((r for r in rows if r.get("engine") == reference_engine() and r.get("repeats")), None)
    batch = report.get("per_device_train_batch_size")
    if single is None or not isinstance(batch, int) or not single.get("samples_per_second"):
        raise UsageError(f"{path} has no successful single run", "rerun bench train")
    return batch / single["samples_per_second"], batch


def workload_from(args: argparse.Namespace) -> Workload:
    from horovod_train.bench.models import layers

    if args.compute_from:
        compute, batch = compute_from(Path(args.compute_from))
    elif args.compute_ms:
        compute, batch = args.compute_ms / 1e3, args.per_device_train_batch_size
    elif args.samples_per_second_1gpu:
        batch = args.per_device_train_batch_size
        compute = batch / args.samples_per_second_1gpu
    else:
        raise UsageError(
            "the model needs the compute time of one step on one GPU",
            "pass --compute_ms, --samples_per_second_1gpu or --compute_from runs/bench/train/bench_train.json",
        )
    sizes = tuple(args.bytes_per_param * n for n in layers.parameter_counts(args.model))
    return Workload(args.model, sizes, compute, batch, args.backward_fraction)


def cluster_from(args: argparse.Namespace) -> Cluster:
    intra = Link(args.intra_gbps * GBPS, args.intra_latency_us / 1e6)
    if args.link_from:
        intra, _ = fit_link(Path(args.link_from))
    inter = Link(args.inter_gbps * GBPS, args.inter_latency_us / 1e6)
    return Cluster(args.gpus_per_node, intra, inter, args.algorithm)


def world_sizes(max_gpus: int, gpus_per_node: int) -> list[int]:
    """Powers of two within a node, then whole nodes, doubling, up to max_gpus."""
    worlds = [2**i for i in range(gpus_per_node.bit_length()) if 2**i < gpus_per_node and 2**i <= max_gpus]
    n = gpus_per_node
    while n <= max_gpus:
        worlds.append(n)
        n *= 2
    return worlds


# The published runs the model is checked against (docs/scaling.md says where each number comes from).
# Horovod paper (Sergeev & Del Balso 2018): 128 servers x 4 Pascal GPUs, 25 Gbit/s RoCE, TensorFlow,
# tf_cnn_benchmarks with 64 images per GPU; one-GPU speeds are TensorFlow's published P100 numbers
# (synthetic data, batch 64); ResNet-101 is interpolated between ResNet-50 and ResNet-152 by FLOPs.
HOROVOD_PAPER_CLUSTER = Cluster(4, Link(10 * GBPS, 5e-6), Link(25 / 8 * GBPS, 10e-6))
HOROVOD_PAPER_SETTING = Setting("horovod-2017", FusionCycle(), 64 * MB, cycle_time=5e-3)
PUBLISHED = (
    {"model": "inception-v3", "gpus": 512, "efficiency": 0.88, "samples_per_second_1gpu": 142.0},
    {"model": "resnet-101", "gpus": 512, "efficiency": 0.88, "samples_per_second_1gpu": 128.7},
    {"model": "vgg-16", "gpus": 512, "efficiency": 0.68, "samples_per_second_1gpu": 154.0},
)


def check_published(bytes_per_param: int = 4) -> list[dict[str, Any]]:
    from horovod_train.bench.models import layers

    rows = []
    for run in PUBLISHED:
        sizes = tuple(bytes_per_param * n for n in layers.parameter_counts(run["model"]))
        workload = Workload(run["model"], sizes, 64 / run["samples_per_second_1gpu"], 64)
        predicted = {}
        for overlap in (True, False):
            setting = replace(HOROVOD_PAPER_SETTING, overlap=overlap)
            (row,) = project(workload, [setting], HOROVOD_PAPER_CLUSTER, [run["gpus"]])
            predicted[overlap] = row["scaling_efficiency"]
        rows.append(
            {
                **run,
                "predicted": predicted[True],
                "predicted_no_overlap": predicted[False],
                "error_points": 100 * (predicted[True] - run["efficiency"]),
                "gradient_mb": sum(sizes) / MB,
            }
        )
    return rows


def published_table(rows: list[dict[str, Any]]) -> list[str]:
    header = ["model", "GPUs", "published", "predicted", "error (points)", "no overlap", "gradients"]
    body = [
        [
            r["model"],
            str(r["gpus"]),
            f"{r['efficiency']:.2f}",
            f"{r['predicted']:.3f}",
            f"{r['error_points']:+.1f}",
            f"{r['predicted_no_overlap']:.3f}",
            f"{r['gradient_mb']:.1f} MiB",
        ]
        for r in rows
    ]
    return format_table(header, body)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from horovod_train.bench.models.layers import MODELS

    parser.add_argument("--output_dir", default="runs/bench/project")
    parser.add_argument("--model", default="bert-base-cased", choices=MODELS, help="whose gradients are reduced")
    parser.add_argument("--per_device_train_batch_size", type=int, default=32)
    parser.add_argument("--compute_ms", type=float, default=None, help="one step on one GPU (forward+backward+update)")
    parser.add_argument("--samples_per_second_1gpu", type=float, default=None, help="or the one-GPU speed")
    parser.add_argument("--compute_from", default=None, help="or bench train's bench_train.json (its single run)")
    parser.add_argument("--backward_fraction", type=float, default=2 / 3, help="share of compute in backward")
    parser.add_argument("--bytes_per_param", type=int, default=4, help="4: float32 gradients, 2: fp16 compression")
    parser.add_argument("--gpus_per_node", type=int, default=8)
    parser.add_argument("--intra_gbps", type=float, default=100.0, help="in-node all-reduce bus bandwidth, GB/s")
    parser.add_argument("--intra_latency_us", type=float, default=5.0)
    parser.add_argument("--inter_gbps", type=float, default=12.5, help="per-node network bandwidth, GB/s")
    parser.add_argument("--inter_latency_us", type=float, default=10.0)
    parser.add_argument("--link_from", default=None, help="fit the in-node link to bench allreduce's allreduce.json")
    parser.add_argument("--algorithm", default="auto", choices=("auto", "ring", "hierarchical"))
    parser.add_argument("--fusion_threshold_mb", type=float, default=128.0, help="Horovod (0.28 default 128)")
    parser.add_argument("--cycle_time_ms", type=float, default=1.0, help="Horovod (0.28 default 1)")
    parser.add_argument("--ddp_bucket_cap_mb", type=float, default=float(DDPArguments.ddp_bucket_cap_mb),
                        help="DDP, as the ddp engine's --ddp_bucket_cap_mb (default 25)")  # fmt: skip
    parser.add_argument("--no_overlap", action="store_true", help="communicate only after backward")
    modelled = list(communications())  # the rows as they are now (a test's row too)
    parser.add_argument("--engines", nargs="+", default=modelled, choices=modelled,
                        help="whose communication to model (fsdp-zero2: no resharding after forward)")  # fmt: skip
    parser.add_argument("--fsdp_units", type=int, default=12, help="fsdp: units sharded (the transformer blocks)")
    parser.add_argument("--max_gpus", type=int, default=1024)
    parser.add_argument("--check_published", action="store_true", help="also predict the Horovod paper's 512-GPU runs")
    parser.add_argument("--lora_r", type=int, default=None,
                        help="also predict LoRA of this rank (its trainable gradients), side by side")  # fmt: skip


def validate(args: argparse.Namespace) -> None:
    """Every argument against its domain (domains.py), before anything is read or written."""
    domains.writable_dir("output_dir", args.output_dir)
    counts = ("per_device_train_batch_size", "gpus_per_node", "max_gpus", "fsdp_units")
    for name in (*counts, *(("lora_r",) if args.lora_r is not None else ())):
        domains.count(1, example="8")(name, getattr(args, name))
    positive = ("compute_ms", "samples_per_second_1gpu", "intra_gbps", "inter_gbps", "fusion_threshold_mb",
                "ddp_bucket_cap_mb")  # fmt: skip
    for name in positive:
        domains.Number(0.0, low_open=True, example="10")(name, getattr(args, name))
    for name in ("intra_latency_us", "inter_latency_us", "cycle_time_ms"):
        domains.Number(0.0, example="5")(name, getattr(args, name))
    domains.Number(0.0, 1.0, low_open=True, example="0.667")("backward_fraction", args.backward_fraction)
    domains.choice("1", "2", "4", "8")("bytes_per_param", str(args.bytes_per_param))
    for name in ("compute_from", "link_from"):
        if getattr(args, name) is not None:
            read_report(Path(getattr(args, name)), name)


def read_report(path: Path, flag: str = "compute_from") -> dict[str, Any]:
    """A JSON report of another benchmark (bench train's, bench allreduce's): an object with rows."""
    domains.path(flag, str(path))
    try:
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(
            f"--{flag} {path} cannot be read as JSON ({str(exc).splitlines()[0][:120]})",
            "pass the .json file the benchmark wrote",
        ) from None
    if not isinstance(report, dict) or not isinstance(report.get("rows"), list):
        raise UsageError(f"--{flag} {path} is not a benchmark report (no rows)", "pass the .json file it wrote")
    return report


def main(args: argparse.Namespace) -> int:
    validate(args)
    workload, cluster = workload_from(args), cluster_from(args)
    rows = project(workload, settings(args), cluster, world_sizes(args.max_gpus, args.gpus_per_node))
    published = check_published(args.bytes_per_param) if args.check_published else []
    lora_rows = []
    if args.lora_r:
        lora_rows = project(lora_workload(args, workload), [replace(s, name=f"{s.name}-lora") for s in settings(args)],
                            cluster, world_sizes(args.max_gpus, args.gpus_per_node))  # fmt: skip
    out = Path(args.output_dir)
    meta = {"workload": {**asdict(workload), "tensor_bytes": len(workload.tensor_bytes)}, "cluster": asdict(cluster)}
    outputs.write_rows(out, "project", COLUMNS, rows + lora_rows, **meta, published=published)
    plot(rows, out / "project.png", title=f"{workload.model}, {workload.batch}/GPU, {cluster.gpus_per_node} GPUs/node")
    print("\n".join(format_table(*table(rows))))
    if lora_rows:
        print(f"\nFull fine-tuning vs LoRA r={args.lora_r}, predicted scaling efficiency:")
        print("\n".join(format_table(*side_by_side(rows, lora_rows))))
    if published:
        print("\nHorovod paper (512 Pascal GPUs, 4 per server, 25 Gbit/s RoCE), scaling efficiency:")
        print("\n".join(published_table(published)))
    print(f"wrote {out}/: project.csv, project.json, project.png")
    return 0


def table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = [
        "setting",
        "GPUs",
        "nodes",
        "algorithm",
        "buckets",
        "step ms",
        "comm ms",
        "exposed ms",
        "samples/s",
        "eff.",
    ]
    body = [
        [
            r["setting"],
            str(r["world_size"]),
            str(r["nodes"]),
            r["algorithm"],
            str(r["buckets"]),
            f"{r['step_ms']:.1f}",
            f"{r['comm_ms']:.1f}",
            f"{r['exposed_comm_ms']:.1f}",
            f"{r['samples_per_second']:.0f}",
            f"{r['scaling_efficiency']:.3f}",
        ]
        for r in rows
    ]
    return header, body


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = outputs.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in dict.fromkeys(r["setting"] for r in rows):
        points = [r for r in rows if r["setting"] == name]
        gpus = [r["world_size"] for r in points]
        axes[0].plot(gpus, [r["samples_per_second"] for r in points], marker="o", label=name)
        axes[1].plot(gpus, [r["scaling_efficiency"] for r in points], marker="o", label=name)
    ideal = sorted({r["world_size"] for r in rows})
    base = rows[0]["samples_per_second"] / rows[0]["world_size"]
    axes[0].plot(ideal, [n * base for n in ideal], ls="--", color="grey", label="linear")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("predicted samples/s")
    axes[1].set_ylabel("predicted scaling efficiency")
    axes[1].set_ylim(0, 1.05)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
