"""`horovod-train bench gpu`: BERT-base fine-tuning throughput and MFU on one GPU, plain vs Horovod np=1.

NOT RUN ON A GPU in this project's sessions so far (no GPU machine was available): the command is
written for one CUDA GPU and exercised on CPU only in its tiny mode (``--tiny``, automatic without CUDA).

Both engines train in this one process through the training loop's own step function
(horovod_train/training/step.py: engine.forward_loss under the precision's autocast, Precision.backward,
Engine.clip_and_step with the GradScaler, if any, zero_grad): the single engine with no wrapper, and the
Horovod engine with hvd.DistributedOptimizer at hvd.size() == 1. Timing windows alternate between them
(--repeats) and medians are reported. The data are random token ids with an MNLI-like length distribution
(log-normal around --mean_length tokens, clipped to [--min_length, --max_seq_length]), padded per batch to
a multiple of 8, optionally grouped by length as --group_by_length does in training. Model FLOPs
utilisation = 6 x non-embedding parameters x (non-padding) tokens/s / the GPU's dense bf16 peak
(PEAK_BF16_TFLOPS by device name, or --peak_tflops): embeddings are lookups, with no matmul FLOPs
(22.7 M of BERT-base's 108.3 M parameters).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters

from horovod_train import domains
from horovod_train.amp import Precision, enable_tf32
from horovod_train.arguments import add_dataclass_arguments, field_default, given
from horovod_train.bench import common
from horovod_train.config import DataArguments, RunConfig, TrainingArguments
from horovod_train.data.loaders import BatchWidths
from horovod_train.engines.base import Engine
from horovod_train.errors import UsageError
from horovod_train.tables import format_table
from horovod_train.training.step import accumulate_and_step

ENGINES = ("single", "horovod")
# The single engine's step in the forms issue 59 compares (--variants), each on the same examples: padded per
# batch (eager, as the engines' rows), padded to --length_buckets lengths, compiled (Inductor, a graph per
# bucket), compiled with CUDA graphs (reduce-overhead), padding-free (a decoder's: BERT has no such form).
VARIANTS = ("eager", "bucketed", "compiled", "cudagraphs", "padding_free")
COMPILE_MODES = {"compiled": "default", "cudagraphs": "reduce-overhead"}
# Dense (not 2:4 sparse) bf16 tensor-core peaks, TFLOP/s, from NVIDIA's data sheets; the first name that
# is part of torch.cuda.get_device_name() wins, so the more specific come first.
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("GH200", 989.0),
    ("H100", 989.0),  # SXM
    ("H200", 989.0),
    ("H800", 989.0),
    ("H20", 148.0),
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("B100", 1750.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10", 125.0),
)
COLUMNS = [
    "engine",
    "variant",
    "model",
    "device",
    "precision",
    "attention",
    "batch_size",
    "repeats",
    "samples_per_second",
    "tokens_per_second",
    "padded_tokens_per_second",
    "step_ms",
    "mfu",
    "graphs",
    "peak_memory_mb",
    "vs_single",
]
# bench gpu's defaults where they differ from train's (its --help shows them): the size-dependent ones
# (tiny, full), then the others.
SIZES = {"per_device_train_batch_size": (8, 128), "steps": (3, 50), "warmup": (1, 10), "max_seq_length": (64, 128)}
DEFAULTS = {
    "output_dir": "runs/bench/gpu",
    "bf16": True,
    "group_by_length": True,
    "length_buckets": 4,
}  # bf16: false with --fp16
SHOWN_DEFAULTS = {**{name: f"{full}; tiny {tiny}" for name, (tiny, full) in SIZES.items()}, **DEFAULTS,
                  "bf16": "True (False with --fp16; --bf16 false without --fp16: fp32)",
                  "peak_tflops": "by device name, PEAK_BF16_TFLOPS"}  # fmt: skip
# train's arguments that bench gpu takes, parsed as train parses them (their domains are train's).
TRAINING_FIELDS = ("output_dir", "per_device_train_batch_size", "seed", "bf16", "fp16", "torch_compile",
                   "group_by_length")  # fmt: skip
DATA_FIELDS = ("max_seq_length", "length_buckets")


@dataclass
class GpuBenchArguments:
    """bench gpu's own options; its training arguments are train's (TRAINING_FIELDS, DATA_FIELDS)."""

    _argument_group_name = "bench gpu arguments"

    model: str = field(default="bert-base-cased", metadata={"help": "The architecture (random init).",
                                                              "choices": common.MODELS})  # fmt: skip
    tiny: bool = field(default=False, metadata={"help": "tiny-bert, few small steps (automatic without CUDA)."})
    steps: int | None = field(default=None, metadata={"help": "Timed steps per window."})
    warmup: int | None = field(default=None, metadata={"help": "Untimed steps first."})
    repeats: int = field(default=3, metadata={"help": "Timing windows per engine, interleaved."})
    mean_length: float = field(default=40.0, metadata={"help": "Mean tokens per example (MNLI: ~40)."})
    min_length: int = field(default=8, metadata={"help": "Fewest tokens of an example."})
    peak_tflops: float | None = field(default=None, metadata={"help": "Dense bf16 peak TFLOP/s for MFU."})
    engines: list[str] = field(default_factory=lambda: list(ENGINES),
                               metadata={"help": "Engines to time.", "choices": ENGINES})  # fmt: skip
    variants: list[str] = field(default_factory=list, metadata={
        "help": "The single engine's step in other forms, timed beside the engines: bucketed (--length_buckets), "
                "compiled, cudagraphs (both bucketed); padding_free is a decoder's (BERT: a row saying why not).",
        "choices": VARIANTS})  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(parser, GpuBenchArguments, shown=SHOWN_DEFAULTS)
    add_dataclass_arguments(parser, TrainingArguments, only=TRAINING_FIELDS, shown=SHOWN_DEFAULTS)
    add_dataclass_arguments(parser, DataArguments, only=DATA_FIELDS, shown=SHOWN_DEFAULTS)
    # HfArgumentParser's --no_<flag> for a flag that defaults to true (here), and this command's earlier spelling.
    parser.add_argument("--no_group_by_length", "--no-group_by_length", dest="group_by_length", action="store_false",
                        default=None, help="The same as --group_by_length false. (default: not given)")  # fmt: skip


def fill_defaults(args: argparse.Namespace) -> None:
    """What the command line left out (None): bench gpu's defaults (tiny or full sizes), else the fields'."""
    tiny = bool(args.tiny) or not torch.cuda.is_available()
    own = {**DEFAULTS, **{name: sizes[0 if tiny else 1] for name, sizes in SIZES.items()}}
    if args.fp16:
        own["bf16"] = False
    fields_defaults = {f.name: field_default(f) for f in dataclasses.fields(GpuBenchArguments)}
    fields_defaults |= {f.name: field_default(f) for f in dataclasses.fields(TrainingArguments)
                        if f.name in TRAINING_FIELDS}  # fmt: skip
    fields_defaults |= {f.name: field_default(f) for f in dataclasses.fields(DataArguments) if f.name in DATA_FIELDS}
    given_values = {**given(args, GpuBenchArguments), **given(args, TrainingArguments), **given(args, DataArguments)}
    vars(args).update({**fields_defaults, **own, **given_values, "tiny": tiny})
    if tiny:
        args.model = "tiny-bert"


def resolve(args: argparse.Namespace) -> None:
    """Fill the defaults (tiny or full) and check every argument against its domain."""
    fill_defaults(args)
    if args.bf16 and args.fp16:
        raise UsageError("--bf16 and --fp16 are both set", "choose one of them")
    args.precision = "fp16" if args.fp16 else "fp32" if args.bf16 is False else "bf16"
    domains.writable_dir("output_dir", args.output_dir)
    domains.Number(0.0, low_open=True, example="989")("peak_tflops", args.peak_tflops)  # None: by GPU name
    sizes = ("per_device_train_batch_size", "steps", "repeats", "min_length")
    positive = {k: getattr(args, k) for k in sizes}
    bad = [f"--{k} {v}" for k, v in positive.items() if v <= 0]
    if bad or args.warmup < 0 or not args.min_length <= args.mean_length <= args.max_seq_length:
        raise UsageError(
            f"bad benchmark sizes ({', '.join(bad) or 'lengths'})",
            "use positive sizes and --min_length <= --mean_length <= --max_seq_length",
        )
    positions = common.bert_config(args.model).max_position_embeddings
    if args.max_seq_length > positions:
        raise UsageError(
            f"--max_seq_length {args.max_seq_length} is more than {args.model}'s {positions} positions",
            f"pass --max_seq_length {positions} or less",
        )
    TrainingArguments(**{name: getattr(args, name) for name in TRAINING_FIELDS})  # train's domains (--seed ...)
    DataArguments(**{name: getattr(args, name) for name in DATA_FIELDS})  # --length_buckets ...


def validate(args: argparse.Namespace) -> None:
    """The argument checks ``main`` runs first (``resolve``), for callers that only check."""
    resolve(args)


def peak_bf16_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of the GPU called ``device_name``; None when the table does not know it."""
    return next((peak for name, peak in PEAK_BF16_TFLOPS if name in device_name), None)


def flop_parameters(model: torch.nn.Module) -> int:
    """Parameters that take part in matmuls: all but the embeddings' (lookups), which 6 x N x tokens
    would count as 6 FLOPs per token each."""
    embedding = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if p.requires_grad and id(p) not in embedding)


def sample_lengths(n: int, args: argparse.Namespace, generator: torch.Generator) -> list[int]:
    """Log-normal lengths with mean --mean_length (sigma 0.45, MNLI-like), clipped to [min, max]."""
    sigma = 0.45
    mu = math.log(args.mean_length) - sigma**2 / 2
    draws = torch.exp(mu + sigma * torch.randn(n, generator=generator))
    return draws.round().clamp(args.min_length, args.max_seq_length).int().tolist()


def batch_lengths(args: argparse.Namespace, generator: torch.Generator) -> list[list[int]]:
    """The examples' lengths of a pool of batches, in the order they are timed."""
    n_batches = max(8, min(64, args.steps))
    size = args.per_device_train_batch_size
    lengths = sample_lengths(n_batches * size, args, generator)
    if args.group_by_length:  # as LengthGroupedSampler: sort inside megabatches of 50 batches
        mega = 50 * size
        lengths = [n for i in range(0, len(lengths), mega) for n in sorted(lengths[i : i + mega], reverse=True)]
    return [lengths[b * size : (b + 1) * size] for b in torch.randperm(n_batches, generator=generator).tolist()]


def make_batches(args: argparse.Namespace, vocab_size: int, pin: bool) -> dict[str, list[dict[str, torch.Tensor]]]:
    """Pools of the same random batches (pinned when on CUDA) as each variant takes them: ``padded``, each
    padded to its longest example (x8); ``bucketed``, to --length_buckets lengths (the training loader's
    BatchWidths)."""
    generator = torch.Generator().manual_seed(args.seed)
    chunks = batch_lengths(args, generator)
    every = [n for chunk in chunks for n in chunk]
    grouped = 1 if args.group_by_length else args.per_device_train_batch_size
    layouts = {"padded": BatchWidths(8), "bucketed": BatchWidths.of(every, args.length_buckets, 8, grouped)}
    pools: dict[str, list[dict[str, torch.Tensor]]] = {name: [] for name in layouts}
    for chunk in chunks:
        ids = [torch.randint(1000, vocab_size, (n,), generator=generator).tolist() for n in chunk]
        labels = torch.randint(0, 3, (len(chunk),), generator=generator)
        for name, widths in layouts.items():
            width = widths.width(max(chunk))
            batch = {
                "input_ids": torch.tensor([i + [0] * (width - len(i)) for i in ids]),
                "attention_mask": torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids]),
                "labels": labels,
            }
            pools[name].append(batch)
    return {
        name: [{k: v.pin_memory() if pin else v for k, v in b.items()} for b in pool] for name, pool in pools.items()
    }


class Contender:
    """One engine's model, optimizer and precision in one of the VARIANTS, stepped by the training loop's own
    step function; the graphs torch.compile made for it, its peak memory."""

    def __init__(
        self, engine: Engine, args: argparse.Namespace, precision: str, max_grad_norm: float, variant: str = "eager"
    ) -> None:
        from transformers import BertForSequenceClassification

        self.engine, self.variant = engine, variant
        torch.manual_seed(args.seed)
        model = BertForSequenceClassification(common.bert_config(args.model))
        self.params = flop_parameters(model)
        if variant in COMPILE_MODES:  # one graph per bucket, each specialised to its length
            model.compile(mode=COMPILE_MODES[variant], dynamic=False)
        elif args.torch_compile:
            model.compile()
        self.graphs = 0
        self.peak_memory = 0
        fused = domains.ADAMW_FUSED[TrainingArguments.optim]  # train's default AdamW implementation
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=fused)
        self.model, self.optimizer = engine.wrap(model, optimizer)
        self.precision = Precision(precision, engine.device)
        self.max_grad_norm = max_grad_norm

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        """One optimizer step of one micro-batch, moved to the device as the loop moves it."""
        on_device = {k: v.to(self.engine.device, non_blocking=True) for k, v in batch.items()}
        compiled_before = counters["stats"]["unique_graphs"]
        accumulate_and_step(
            self.engine, self.model, self.optimizer, self.precision, iter([on_device]), 1, self.max_grad_norm
        )
        self.graphs += counters["stats"]["unique_graphs"] - compiled_before

    def pool(self, pools: dict[str, list[dict[str, torch.Tensor]]]) -> list[dict[str, torch.Tensor]]:
        """The variant's batches."""
        return pools["padded" if self.variant == "eager" else "bucketed"]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def window(contender: Contender, pools: dict[str, list], steps: int, first: int) -> dict[str, float]:
    device = contender.engine.device
    batches = contender.pool(pools)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    samples = tokens = padded = 0
    for i in range(steps):
        batch = batches[(first + i) % len(batches)]
        contender.step(batch)
        samples += batch["labels"].shape[0]
        mask = batch.get("attention_mask")  # none in a padding-free batch: every token is real
        tokens += int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        padded += batch["input_ids"].numel()
    synchronize(device)
    seconds = time.perf_counter() - started
    if device.type == "cuda":
        contender.peak_memory = max(contender.peak_memory, torch.cuda.max_memory_allocated(device))
    return {"seconds": seconds, "samples": samples, "tokens": tokens, "padded_tokens": padded, "steps": steps}


def setup_engine(name: str, training: TrainingArguments) -> Engine:
    from horovod_train.engines import create_engine

    engine = create_engine(RunConfig(training=dataclasses.replace(training, engine=name)))
    engine.setup()
    return engine


def main(args: argparse.Namespace) -> int:
    resolve(args)
    cuda = torch.cuda.is_available()
    if cuda:
        enable_tf32()
    training = TrainingArguments(bf16=args.precision == "bf16", fp16=args.precision == "fp16", max_grad_norm=1.0)
    engines = {name: setup_engine(name, training) for name in {*args.engines, *(["single"] if args.variants else [])}}
    try:
        contenders = {
            name: Contender(engines[name], args, args.precision, training.max_grad_norm) for name in args.engines
        }
        skipped = [row for row in (skipped_variant(v, args.model) for v in args.variants) if row is not None]
        for variant in (v for v in args.variants if v not in {row["variant"] for row in skipped}):
            if variant != "eager" or "single" not in args.engines:
                contenders[f"single/{variant}"] = Contender(
                    engines["single"], args, args.precision, training.max_grad_norm, variant
                )
        pools = make_batches(args, common.bert_config(args.model).vocab_size, pin=cuda)
        for c in contenders.values():
            window(c, pools, args.warmup, 0)
        raw = [
            {"engine": name, "repeat": rep, **window(c, pools, args.steps, rep * args.steps)}
            for rep in range(args.repeats)
            for name, c in contenders.items()
        ]
        rows = summarize(raw, contenders, args, cuda, peak_tflops(args, cuda))
    finally:
        for engine in engines.values():
            engine.shutdown()
    out = Path(args.output_dir)
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    common.write_rows(out, "gpu", COLUMNS, rows, raw=raw, skipped=skipped, tiny=args.tiny, device=device,
                      args=vars(args))  # fmt: skip
    plot(rows, out / "gpu.png")
    print("\n".join(format_table(*table([*rows, *skipped]))))
    if args.tiny:
        print("tiny mode (no CUDA or --tiny): a smoke test of the command, not a GPU measurement")
    for r in rows:
        if r["engine"] != "single" and r["vs_single"] == r["vs_single"]:
            print(f"==> {r['engine']} np=1 / plain samples/s: {r['vs_single']:.3f}x")
        elif r["variant"] != "eager":
            print(f"==> {r['variant']} / plain samples/s: {r['vs_single']:.3f}x, {r['graphs']} graphs compiled")
    print(f"wrote {out}/: gpu.csv, gpu.json, gpu.png")
    return 0


def peak_tflops(args: argparse.Namespace, cuda: bool) -> float:
    """--peak_tflops, else the table's peak for this GPU; NaN (no MFU) for a GPU it does not know, or the CPU."""
    if args.peak_tflops:
        return args.peak_tflops
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak = peak_bf16_tflops(name) if cuda else None
    if peak is None and cuda:
        print(f"no bf16 peak known for {name}: MFU not computed (pass --peak_tflops)")
    return peak or float("nan")


def summarize(
    raw: list[dict], contenders: dict[str, Contender], args: argparse.Namespace, cuda: bool, peak: float
) -> list[dict]:
    """Per engine, the rates of its median window (by samples/s), so they all describe one window."""
    rows = []
    for name, c in contenders.items():
        runs = sorted((r for r in raw if r["engine"] == name), key=lambda r: r["samples"] / r["seconds"])
        w = runs[(len(runs) - 1) // 2]
        tokens = w["tokens"] / w["seconds"]
        rows.append(
            {
                "engine": c.engine.name,
                "variant": c.variant,
                "model": args.model,
                "device": str(c.engine.device),
                "precision": args.precision,
                "attention": c.engine.unwrap(c.model).config._attn_implementation,  # sdpa: transformers 5's default
                "batch_size": args.per_device_train_batch_size,
                "repeats": len(runs),
                "samples_per_second": w["samples"] / w["seconds"],
                "tokens_per_second": tokens,
                "padded_tokens_per_second": w["padded_tokens"] / w["seconds"],
                "step_ms": 1e3 * w["seconds"] / w["steps"],
                "mfu": 6 * c.params * tokens / (peak * 1e12),
                "peak_tflops": peak,
                "graphs": c.graphs,  # torch.compile's, warm-up included: a handful (the buckets), not one per batch
                "peak_memory_mb": c.peak_memory / 2**20 if cuda else float("nan"),
                "parameters": c.params,
            }
        )
    base = next((r["samples_per_second"] for r in rows if r["engine"] == "single" and r["variant"] == "eager"),
                float("nan"))  # fmt: skip
    for r in rows:
        r["vs_single"] = r["samples_per_second"] / base
    return rows


def skipped_variant(variant: str, model: str) -> dict[str, str] | None:
    """The table's row saying why ``variant`` is not timed on ``model``, or None. Padding-free batches are the
    decoder families' (model.DECODER_FAMILIES): an encoder attends both ways over its padded row, and
    transformers' encoders do not split a flattened row by position ids (train refuses --padding_free for one)."""
    from horovod_train.model import DECODER_FAMILIES

    family = common.bert_config(model).model_type
    if variant != "padding_free" or family in DECODER_FAMILIES:
        return None
    decoders = ", ".join(DECODER_FAMILIES)
    why = f"skipped: {model} is an encoder ({family}); padding-free is the decoder families' ({decoders})"
    return {"engine": "single", "variant": variant, "model": model, "skipped": why}


def table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Measured rows, and a skipped variant's row with its reason (``skipped_variant``)."""
    header = ["engine", "variant", "model", "precision", "batch", "samples/s", "tokens/s", "padded tokens/s",
              "step ms", "MFU", "graphs", "peak MB", "vs single"]  # fmt: skip
    skipped = [[r["engine"], r["variant"], r["model"], *["-"] * (len(header) - 4), r["skipped"]]
               for r in rows if "skipped" in r]  # fmt: skip
    rows = [r for r in rows if "skipped" not in r]
    body = [
        [
            r["engine"],
            r["variant"],
            r["model"],
            r["precision"],
            str(r["batch_size"]),
            f"{r['samples_per_second']:.1f}",
            f"{r['tokens_per_second']:.0f}",
            f"{r['padded_tokens_per_second']:.0f}",
            f"{r['step_ms']:.2f}",
            f"{100 * r['mfu']:.2f}%",
            str(r["graphs"]),
            f"{r['peak_memory_mb']:.0f}",
            f"{r['vs_single']:.3f}",
        ]
        for r in rows
    ]
    return header, body + skipped


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(rows) + 1.6))
    bars = ax.barh(
        [f"{r['engine']} {r['variant']}" for r in rows], [r["samples_per_second"] for r in rows], color="tab:blue"
    )
    ax.bar_label(bars, labels=[f"{r['samples_per_second']:.0f}/s, MFU {100 * r['mfu']:.1f}%" for r in rows])
    ax.set_xlabel("training samples/s")
    ax.set_title(f"{rows[0]['model']} {rows[0]['precision']}, batch {rows[0]['batch_size']} on {rows[0]['device']}")
    ax.margins(x=0.35)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
