"""Loaders: the training sampler (DistributedSampler's sharding, resumable inside an epoch, optionally
grouped by length), the evaluation shards (every example once over all ranks), the collators (padded to a
batch's longest, to a multiple, to a few bucket lengths, or flattened without padding) and the copy of
batches to the device one step ahead."""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Sequence, Sized
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset
from torch.utils.data import DataLoader, DistributedSampler, Sampler
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from horovod_train.tasks import registry


class ResumableDistributedSampler(DistributedSampler):
    """A DistributedSampler that can start inside an epoch (resuming a checkpoint mid-epoch).

    The trainer drives every training sampler through ``begin_epoch`` and ``record_step``, so an
    engine may substitute its own (Horovod elastic re-shards the rest of an epoch on a resize)."""

    skip = 0  # indices of this rank's shard to skip in the current epoch

    def begin_epoch(self, epoch: int, samples_in_epoch: int) -> None:
        """Start ``epoch`` after the ``samples_in_epoch`` examples (all ranks together) already trained on.

        At most the whole shard is skipped: checkpoints written before the position counted a partial last
        batch as it was hold a full batch's count at an epoch's last step, and resume at the epoch's end."""
        self.set_epoch(epoch)
        self.skip = min(samples_in_epoch // self.num_replicas, self.num_samples)

    def record_step(self, samples_per_rank: int) -> None:
        """Called after each optimizer step; the position is kept by the trainer's step count."""

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return super().__len__() - self.skip


class LengthGroupedSampler(ResumableDistributedSampler):
    """DistributedSampler's sharding of an order in which each global batch holds examples of similar length.

    ``batch_size`` is what a rank takes per optimizer step (per-device batch x gradient accumulation), so a
    global batch is the ``batch_size`` x world size examples of one optimizer step. Each epoch (seeded by
    seed + epoch, the same on every rank): a permutation of the dataset, cut into megabatches of
    ``megabatch_batches`` global batches, each sorted longest first; cut into global batches, whose order
    is shuffled (a last, partial one stays last); then padded to a multiple of the world size with the
    examples DistributedSampler repeats (the permutation's first). Rank r takes every world_size-th
    index, so a rank's k-th step is its share of global batch k. The order before the padding depends on
    the global batch only, not on how it splits into ranks x per-device batch x accumulation: a run
    resumed with another split of the same global batch trains on the same examples at each step, as
    with DistributedSampler."""

    def __init__(
        self,
        dataset: Sized,
        lengths: Sequence[int],
        batch_size: int,
        num_replicas: int,
        rank: int,
        seed: int,
        megabatch_batches: int = 50,
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        if len(lengths) != len(dataset):
            raise ValueError(f"{len(lengths)} lengths for {len(dataset)} examples")
        self.lengths = list(lengths)
        self.global_batch = batch_size * num_replicas
        self.megabatch = self.global_batch * megabatch_batches

    def global_order(self) -> list[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        permutation = torch.randperm(len(self.lengths), generator=generator).tolist()
        grouped: list[int] = []
        for start in range(0, len(permutation), self.megabatch):
            megabatch = permutation[start : start + self.megabatch]
            grouped += sorted(megabatch, key=self.lengths.__getitem__, reverse=True)
        batches = [grouped[i : i + self.global_batch] for i in range(0, len(grouped), self.global_batch)]
        partial = batches.pop() if len(batches[-1]) < self.global_batch else None
        shuffled = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
        order = [i for batch in shuffled + ([partial] if partial else []) for i in batch]
        # Padded after the grouping, so that only the padding depends on the world size; with the examples
        # DistributedSampler repeats (the permutation's first).
        padding = self.total_size - len(order)
        return order + (permutation * math.ceil(padding / len(permutation)))[:padding]

    def __iter__(self):
        return itertools.islice(iter(self.global_order()[self.rank :: self.num_replicas]), self.skip, None)


def example_lengths(dataset: Dataset) -> list[int]:
    return [len(ids) for ids in dataset["input_ids"]]


def _one_thread(worker_id: int) -> None:
    torch.set_num_threads(1)  # a loader worker must not compete with its rank for the rank's cores


def train_loader(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    world_size: int,
    rank: int,
    seed: int,
    num_workers: int = 0,
    sampler: Sampler | None = None,
    group_by_length: bool = False,
    pin_memory: bool = False,
    gradient_accumulation_steps: int = 1,
    widths: BatchWidths | None = None,
    padding_free: bool = False,
) -> DataLoader:
    """Rank r takes every world_size-th example of one seeded permutation, so the global batch of
    step k is the same contiguous slice of that permutation for every world size (see docs/equivalence.md).
    ``group_by_length`` reorders that permutation so that the global batch of an optimizer step
    (``batch_size`` x ``gradient_accumulation_steps`` x ``world_size``) holds examples of similar length.
    ``widths``: the lengths batches are padded to; ``padding_free``: batches flattened, not padded."""
    if sampler is None and group_by_length:
        lengths = example_lengths(dataset)
        step_batch = batch_size * gradient_accumulation_steps
        sampler = LengthGroupedSampler(dataset, lengths, step_batch, num_replicas=world_size, rank=rank, seed=seed)
    if sampler is None:
        sampler = ResumableDistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    collate = FlattenedBatches(collator(dataset, tokenizer)) if padding_free else collator(dataset, tokenizer, widths)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate,
        drop_last=False,
        pin_memory=pin_memory,
        worker_init_fn=_one_thread if num_workers else None,
        persistent_workers=num_workers > 0,
        generator=own_generator(seed),
    )


def own_generator(seed: int) -> torch.Generator:
    """For a DataLoader's worker seeds. Without one, every ``iter(loader)`` draws from the global torch
    RNG, and a run resumed mid-epoch (one more ``iter``) would get other dropout masks from then on."""
    return torch.Generator().manual_seed(seed)


def eval_loader(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    world_size: int,
    rank: int,
    widths: BatchWidths | None = None,
) -> DataLoader:
    """An unpadded strided shard: every example is evaluated exactly once over all ranks. ``widths``: the
    training's (the lengths its batches are padded to), with the split's longest example as a last bucket
    where it is longer than the training's: a compiled model sees no length in evaluation it was not given
    in training but that one."""
    shard = dataset.add_column("example_index", list(range(len(dataset)))).select(
        range(rank, len(dataset), world_size), keep_in_memory=True
    )
    if widths is not None:
        widths = widths.covering(max(example_lengths(dataset), default=0))
    collate = collator(dataset, tokenizer, widths)
    return DataLoader(shard, batch_size=batch_size, shuffle=False, collate_fn=collate, generator=own_generator(0))


def collator(dataset: Dataset, tokenizer: PreTrainedTokenizerBase, widths: BatchWidths | None = None):
    """The collator of a tokenized split, its task shape's (padding alone for a split without labels), its
    batches widened to ``widths`` (None: each to its longest example)."""
    feature = dataset.features.get("labels")
    if feature is None:
        shaped = DataCollatorWithPadding(tokenizer)
    else:
        shaped = registry.holding(feature).collator(tokenizer, feature)
    return shaped if widths is None else WidenedBatches(shaped, widths, tokenizer.pad_token_id, tokenizer.padding_side)


# The collated tensors that have one column per token (labels may be 2-D too: a multi-hot row).
TOKEN_COLUMNS = {"input_ids": None, "attention_mask": 0, "token_type_ids": 0}  # their padding value (None: pad id)


@dataclass(frozen=True)
class BatchWidths:
    """The lengths batches are padded to: the first of ``buckets`` (ascending) that holds the batch's longest
    example, else that length rounded up to ``multiple``. A compiled step is compiled once per distinct shape:
    padded to a handful of lengths, a run compiles a handful of times, not once per batch."""

    multiple: int = 1
    buckets: tuple[int, ...] = ()

    def width(self, longest: int) -> int:
        bucket = next((b for b in self.buckets if b >= longest), None)
        return bucket if bucket is not None else self.multiple * math.ceil(longest / self.multiple)

    def covering(self, longest: int) -> BatchWidths:
        """These widths with a last bucket for ``longest`` where it is longer than every bucket (another split's
        longest example): batches longer than the buckets take one shape, not one per length."""
        if not self.buckets or longest <= self.buckets[-1]:
            return self
        return BatchWidths(self.multiple, (*self.buckets, self.width(longest)))

    @classmethod
    def of(cls, lengths: Sequence[int], buckets: int, multiple: int | None, batch: int = 1) -> BatchWidths | None:
        """``buckets`` lengths at the quantiles of the longest of ``batch`` examples drawn at random from
        ``lengths`` (the training data's; ``batch`` 1: examples grouped by length), each rounded up to
        ``multiple``, the last the longest; None when neither is asked for. (The longest of ``batch`` is at
        most the q-quantile with probability q ** batch, so its q-quantile is the examples' q ** (1 / batch).)"""
        if not buckets and not multiple:
            return None
        multiple = multiple or 1
        ordered = sorted(lengths)
        levels = [((i + 1) / buckets) ** (1 / batch) for i in range(buckets)]
        quantiles = [ordered[max(math.ceil(len(ordered) * level) - 1, 0)] for level in levels]
        return cls(multiple, tuple(sorted({multiple * math.ceil(n / multiple) for n in quantiles})))


class WidenedBatches:
    """A collator whose batches are padded further, to ``widths``'s length for their longest example (on the
    tokenizer's padding side). A class, not a closure: loader workers may pickle it."""

    def __init__(self, shaped: Any, widths: BatchWidths, pad_token_id: int | None, padding_side: str) -> None:
        self.shaped, self.widths, self.pad_token_id, self.padding_side = shaped, widths, pad_token_id or 0, padding_side

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        batch = self.shaped(features)
        longest = batch["input_ids"].shape[1]
        extra = self.widths.width(longest) - longest
        if extra == 0:
            return batch
        sides = (extra, 0) if self.padding_side == "left" else (0, extra)
        for name, value in TOKEN_COLUMNS.items():
            if name in batch:
                fill = self.pad_token_id if value is None else value
                batch[name] = torch.nn.functional.pad(batch[name], sides, value=fill)
        return batch


class FlattenedBatches:
    """Padding-free batches (transformers' DataCollatorWithFlattening, for sequence classification): a batch's
    examples end to end in one row, ``position_ids`` restarting at 0 for each (the model's attention keeps the
    examples apart by them), ``example_ends`` the index of each example's last token (where a decoder's
    classifier reads it), the labels as the task shape's collator makes them."""

    def __init__(self, shaped: Any) -> None:
        self.shaped = shaped

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        labels = self.shaped([{"input_ids": f["input_ids"][:1], "labels": f["labels"]} for f in features])["labels"]
        lengths = torch.tensor([len(f["input_ids"]) for f in features])
        ids = torch.tensor([i for f in features for i in f["input_ids"]], dtype=torch.long)
        starts = torch.cumsum(lengths, 0) - lengths
        positions = torch.arange(len(ids)) - torch.repeat_interleave(starts, lengths)
        batch = {"input_ids": ids[None], "position_ids": positions[None], "example_ends": starts + lengths - 1}
        extra = {k: torch.tensor([f[k] for f in features]) for k in ("example_index",) if k in features[0]}
        return {**batch, "labels": labels, **extra}


Batch = dict[str, torch.Tensor]


def ahead_on_device(batches: Iterator[Batch], device: torch.device) -> Iterator[Batch]:
    """``batches`` on ``device``, each copied while the one before computes: from pinned memory without
    blocking the host (non_blocking), on CUDA on a copy stream that the compute stream waits for."""
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def copy(batch: Batch) -> Batch:
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            return {k: v.to(device, non_blocking=True) for k, v in batch.items()}

    following = next(batches, None)
    ahead = copy(following) if following is not None else None
    while ahead is not None:
        current = ahead
        following = next(batches, None)
        ahead = copy(following) if following is not None else None
        if stream is not None:
            torch.cuda.current_stream(device).wait_stream(stream)
            for tensor in current.values():
                tensor.record_stream(torch.cuda.current_stream(device))  # not reused while the step reads it
        yield current
