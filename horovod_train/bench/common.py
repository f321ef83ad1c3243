"""What the benchmarks share: byte sizes, bandwidths as nccl-tests defines them, the BERT shapes they
measure, DDP's gradient buckets (the one model of them: bench allreduce reduces them, bench project times
them), and their CSV/JSON/PNG outputs."""

from __future__ import annotations

import csv
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from horovod_train.common.files import write_json_atomic
from horovod_train.common.errors import UsageError

UNITS = {
    "": 1,
    "B": 1,
    "K": 2**10,
    "KB": 2**10,
    "KIB": 2**10,
    "M": 2**20,
    "MB": 2**20,
    "MIB": 2**20,
    "G": 2**30,
    "GB": 2**30,
    "GIB": 2**30,
}  # binary, as nccl-tests' -b/-e sizes
GB = 1e9  # bandwidths in GB/s (10^9 bytes), as nccl-tests prints them

MODELS = ("tiny-bert", "bert-base-cased")
# A Llama-style decoder of about 0.5B parameters (0.51B with a 2000-token vocabulary: its transformer body is
# Qwen2.5-0.5B's depth at width 1024, head size 64, full multi-head attention), random init.
DECODER_0_5B = dict(
    vocab_size=2000,
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=16,
    intermediate_size=5504,
    max_position_embeddings=512,
)
# DDP's buckets as torch 2.13 forms them: bucket_cap_mb (25 MiB unless given), and only when it is not given
# is the first bucket (the last layers' gradients) capped at 1 MiB. The ddp engine always passes its
# --ddp_bucket_cap_mb, so its buckets all have the one cap (tests/integration/test_ddp_buckets.py checks DDP's own).
DDP_DEFAULT_CAP_MB, DDP_DEFAULT_FIRST_BUCKET_BYTES = 25, 2**20


def parse_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match[2].upper() if match else None
    if not match or unit not in UNITS:
        raise UsageError(f"cannot read {text!r} as a size in bytes", "write e.g. 4KB, 64MB or 1GB")
    return int(float(match[1]) * UNITS[unit])


def format_bytes(n: float) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= size:
            return f"{n / size:.4g}{unit}"
    return f"{n:.0f}B"


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: the bytes of the (summed) buffer over the time of the operation."""
    return nbytes / seconds / GB


def busbw(alg: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of all-reduce, 2(n-1)/n x algbw: comparable with the link's peak."""
    return alg * 2 * (world_size - 1) / world_size


def ddp_caps(bucket_cap_mb: float | None) -> tuple[int, int]:
    """(cap, first bucket's cap) in bytes of ``DistributedDataParallel(bucket_cap_mb=...)``."""
    if bucket_cap_mb is None:
        return DDP_DEFAULT_CAP_MB * 2**20, DDP_DEFAULT_FIRST_BUCKET_BYTES
    return int(bucket_cap_mb * 2**20), int(bucket_cap_mb * 2**20)


def ddp_buckets(tensor_bytes: Sequence[int], bucket_cap_mb: float | None) -> list[tuple[int, int]]:
    """The one model of DDP's gradient buckets: over tensors of ``tensor_bytes`` (in parameter order), a
    list of (position in backward order of the gradient that completes the bucket, bytes). Backward makes
    the gradients in reverse order; a bucket is closed once it holds its cap or more (``ddp_caps``)."""
    cap, limit = ddp_caps(bucket_cap_mb)
    buckets, size = [], 0
    for position, nbytes in enumerate(reversed(tensor_bytes)):
        size += nbytes
        if size >= limit:
            buckets.append((position, size))
            size, limit = 0, cap
    return buckets + ([(len(tensor_bytes) - 1, size)] if size else [])


def bert_config(name: str, num_labels: int = 3) -> Any:
    from transformers import BertConfig

    from horovod_train.models.model import BERT_BASE_CASED, TINY_BERT_CONFIG, TINY_VOCAB_SIZE

    if name == "tiny-bert":
        return BertConfig(vocab_size=TINY_VOCAB_SIZE, num_labels=num_labels, **TINY_BERT_CONFIG)
    if name == "bert-base-cased":
        return BertConfig(num_labels=num_labels, **BERT_BASE_CASED)
    raise UsageError(f"unknown benchmark model {name!r}", f"use {' or '.join(MODELS)}")


def decoder_config(num_labels: int = 3) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(num_labels=num_labels, pad_token_id=0, **DECODER_0_5B)  # train sets the tokenizer's


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


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


def write_rows(out_dir: Path, stem: str, columns: Sequence[str], rows: list[dict[str, Any]], **meta: Any) -> None:
    """``stem``.csv (the columns, one row each) and ``stem``.json (every field of every row, plus meta)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / f"{stem}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    write_json_atomic(out_dir / f"{stem}.json", {**meta, "columns": list(columns), "rows": rows})


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
