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
from pathlib import Path
from typing import Any

import torch

from horovod_train.bench import outputs
from horovod_train.bench.architectures import model_config
from horovod_train.bench.engine_names import reference_engine
from horovod_train.bench.gpu.arguments import add_arguments, resolve, validate
from horovod_train.bench.gpu.batches import make_batches
from horovod_train.bench.gpu.contender import Contender, setup_engine, window
from horovod_train.bench.gpu.loop import LoopContender
from horovod_train.common.tables import format_table
from horovod_train.config.run_config import TrainingArguments
from horovod_train.training.amp import enable_tf32

__all__ = ["add_arguments", "main", "validate"]  # what bench/__init__.py asks of a benchmark's module

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
    "vs_bare",
    "loss",
]


def peak_bf16_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of the GPU called ``device_name``; None when the table does not know it."""
    return next((peak for name, peak in PEAK_BF16_TFLOPS if name in device_name), None)


def main(args: argparse.Namespace) -> int:
    resolve(args)
    cuda = torch.cuda.is_available()
    if cuda:
        enable_tf32()
    training = TrainingArguments(bf16=args.precision == "bf16", fp16=args.precision == "fp16", max_grad_norm=1.0)
    reference = reference_engine()  # the variants' engine, and what every row is compared with (vs_single)
    engines = {name: setup_engine(name, training) for name in {*args.engines, *([reference] if args.variants else [])}}
    contenders: dict[str, Contender] = {}
    try:
        contenders |= {name: Contender(engines[name], args, training) for name in args.engines}
        skipped = [row for row in (skipped_variant(v, args.model) for v in args.variants) if row is not None]
        for variant in (v for v in args.variants if v not in {row["variant"] for row in skipped}):
            if variant == "loop":
                contenders[f"{reference}/loop"] = LoopContender(engines[reference], args, training)
            elif variant != "eager" or reference not in args.engines:
                contenders[f"{reference}/{variant}"] = Contender(engines[reference], args, training, variant)
        pools = make_batches(args, model_config(args.model).vocab_size, pin=cuda)
        for c in contenders.values():
            window(c, pools, args.warmup)
        raw = [
            {"engine": name, "repeat": rep, **window(c, pools, args.steps)}
            for rep in range(args.repeats)
            for name, c in contenders.items()
        ]
        rows = summarize(raw, contenders, args, cuda, peak_tflops(args, cuda))
    finally:
        for c in contenders.values():
            c.close()
        for engine in engines.values():
            engine.shutdown()
    out = Path(args.output_dir)
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    outputs.write_rows(out, "gpu", COLUMNS, rows, raw=raw, skipped=skipped, tiny=args.tiny, device=device,
                       args=vars(args))  # fmt: skip
    plot(rows, out / "gpu.png")
    print("\n".join(format_table(*table([*rows, *skipped]))))
    if args.tiny:
        print("tiny mode (no CUDA or --tiny): a smoke test of the command, not a GPU measurement")
    for r in rows:
        if r["engine"] != reference and r["vs_single"] == r["vs_single"]:
            print(f"==> {r['engine']} np=1 / plain samples/s: {r['vs_single']:.3f}x")
        elif r["variant"] == "loop":
            print(f"==> loop / bare step (bucketed) samples/s: {r['vs_bare']:.3f}x (train's loop adds "
                  f"{100 * (1 / r['vs_bare'] - 1):.1f}% to the step)")  # fmt: skip
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
                # Its last window's mean: every contender steps through the same batches from the same init, so
                # the variants' (padding-free's, the loop's too) agree with eager's up to rounding.
                "loss": c.last_loss(),
            }
        )
    reference = reference_engine()
    base = next((r["samples_per_second"] for r in rows if r["engine"] == reference and r["variant"] == "eager"),
                float("nan"))  # fmt: skip
    # The loop's row against the bare step it takes (the bucketed one): what `train`'s loop adds.
    bare = next((r["samples_per_second"] for r in rows if r["engine"] == reference and r["variant"] == "bucketed"),
                float("nan"))  # fmt: skip
    for r in rows:
        r["vs_single"] = r["samples_per_second"] / base
        r["vs_bare"] = r["samples_per_second"] / bare if r["variant"] == "loop" else float("nan")
    return rows


def skipped_variant(variant: str, model: str) -> dict[str, str] | None:
    """The table's row saying why ``variant`` is not timed on ``model``, or None. Padding-free batches are the
    decoder families' (model.DECODER_FAMILIES): an encoder attends both ways over its padded row, and
    transformers' encoders do not split a flattened row by position ids (train refuses --padding_free for one)."""
    from horovod_train.models.model import DECODER_FAMILIES

    family = model_config(model).model_type
    if variant != "padding_free" or family in DECODER_FAMILIES:
        return None
    decoders = ", ".join(DECODER_FAMILIES)
    why = f"skipped: {model} is an encoder ({family}); padding-free is the decoder families' ({decoders})"
    return {"engine": reference_engine(), "variant": variant, "model": model, "skipped": why}


def table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Measured rows, and a skipped variant's row with its reason (``skipped_variant``)."""
    header = ["engine", "variant", "model", "precision", "batch", "samples/s", "tokens/s", "padded tokens/s",
              "step ms", "MFU", "graphs", "peak MB", "vs single", "vs bare", "loss"]  # fmt: skip
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
            f"{r['vs_bare']:.3f}" if r["variant"] == "loop" else "-",  # the loop's against the bucketed step
            f"{r['loss']:.4f}",
        ]
        for r in rows
    ]
    return header, body + skipped


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = outputs.pyplot()
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
