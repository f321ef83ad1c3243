"""bench gpu's batches: random token ids with an MNLI-like length distribution (log-normal around --mean_length
tokens, clipped to [--min_length, --max_seq_length]), grouped by length as --group_by_length does in training, padded
as each variant takes them (per batch to a multiple of 8, or to the training loader's --length_buckets widths), or
flattened, unpadded (--padding_free's, the training loader's FlattenedBatches); or as examples, for the
training loader itself to batch (the ``loop`` variant's)."""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch

from horovod_train.data.loaders import BatchWidths, FlattenedBatches


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


def make_examples(args: argparse.Namespace, vocab_size: int) -> list[list[dict[str, Any]]]:
    """The pool's batches as lists of tokenized examples (``input_ids``, ``labels``), in the order they are timed:
    what the training loader takes (the ``loop`` variant's), and what every other variant's batches are made of."""
    generator = torch.Generator().manual_seed(args.seed)
    chunks = []
    for chunk in batch_lengths(args, generator):
        ids = [torch.randint(1000, vocab_size, (n,), generator=generator).tolist() for n in chunk]
        labels = torch.randint(0, 3, (len(chunk),), generator=generator).tolist()
        chunks.append([{"input_ids": i, "labels": label} for i, label in zip(ids, labels, strict=True)])
    return chunks


def bucket_widths(args: argparse.Namespace, chunks: list[list[dict[str, Any]]]) -> BatchWidths | None:
    """The --length_buckets lengths of these examples, as the training loader's (build.batch_widths)."""
    every = [len(e["input_ids"]) for chunk in chunks for e in chunk]
    grouped = 1 if args.group_by_length else args.per_device_train_batch_size
    return BatchWidths.of(every, args.length_buckets, 8, grouped)


def make_batches(args: argparse.Namespace, vocab_size: int, pin: bool) -> dict[str, list[dict[str, torch.Tensor]]]:
    """Pools of the same random batches (pinned when on CUDA) as each variant takes them: ``padded``, each
    padded to its longest example (x8); ``bucketed``, to --length_buckets lengths (the training loader's
    BatchWidths); ``flattened``, the examples end to end in one row (FlattenedBatches)."""
    chunks = make_examples(args, vocab_size)
    layouts = {"padded": BatchWidths(8), "bucketed": bucket_widths(args, chunks)}
    pools: dict[str, list[dict[str, torch.Tensor]]] = {name: [] for name in [*layouts, "flattened"]}
    flatten = FlattenedBatches(lambda features: {"labels": torch.tensor([f["labels"] for f in features])})
    for examples in chunks:
        ids = [e["input_ids"] for e in examples]
        labels = torch.tensor([e["labels"] for e in examples])
        for name, widths in layouts.items():
            width = widths.width(max(map(len, ids)))
            batch = {
                "input_ids": torch.tensor([i + [0] * (width - len(i)) for i in ids]),
                "attention_mask": torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids]),
                "labels": labels,
            }
            pools[name].append(batch)
        pools["flattened"].append(flatten(examples))
    return {
        name: [{k: v.pin_memory() if pin else v for k, v in b.items()} for b in pool] for name, pool in pools.items()
    }
