"""Data: hub datasets, local files and synthetic-nli, all through one validate/tokenize/collate path."""

from __future__ import annotations

import csv
import hashlib
import itertools
import math
import os
from collections import Counter
from collections.abc import Sequence, Sized
from pathlib import Path

import pyarrow as pa
import torch
from datasets import Dataset, DatasetDict, load_from_disk
from torch.utils.data import DataLoader, DistributedSampler, Sampler
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from horovod_train import synthetic
from horovod_train.config import DataArguments
from horovod_train.errors import UsageError
from horovod_train.files import atomic_directory

TEXT_COLUMNS = ("premise", "hypothesis")
LABEL_COLUMN = "label"
SPLIT_SEED = 42  # the tutorials' 90/10 split of the train set
SYNTHETIC = "synthetic-nli"
FILE_READERS = {".csv": ",", ".tsv": "\t", ".json": None, ".jsonl": None}
GLUE_COLUMNS = {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"}  # GLUE's MNLI/SNLI .tsv


def default_cache_dir() -> Path:
    return Path(os.environ.get("HOROVOD_TRAIN_CACHE", Path.home() / ".cache" / "horovod-train"))


def _read_file(path: str, flag: str) -> Dataset:
    import pandas as pd

    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in FILE_READERS:
        raise UsageError(f"{flag} {path} has unsupported extension {suffix!r}", "use .csv, .tsv, .json or .jsonl")
    if not file.is_file():
        raise UsageError(f"{flag} {path} does not exist", f"pass an existing file to {flag}")
    try:
        if FILE_READERS[suffix] is None:
            frame = pd.read_json(file, lines=suffix == ".jsonl" or _looks_like_jsonl(file))
        else:
            # TSV (GLUE's included) is not quoted: a '"' in a text is a character, not the start of a quoted field.
            # Only an empty cell is missing: a text "NA", "None" or "null" stays text.
            quoting = csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL
            frame = pd.read_csv(file, sep=FILE_READERS[suffix], quoting=quoting, keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        raise UsageError(f"{flag} {path} is empty", "give it a header and at least one example") from None
    except (ValueError, pd.errors.ParserError) as exc:
        reason = str(exc).splitlines()[0][:160]
        raise UsageError(f"{flag} {path} cannot be parsed ({reason})", "fix the file's format") from None
    if suffix == ".tsv":
        _check_one_row_per_line(file, len(frame), flag)
    return Dataset.from_pandas(frame, preserve_index=False)


def _check_one_row_per_line(file: Path, rows: int, flag: str) -> None:
    """Each non-blank line after the header must be one example (pandas also ends a row at a lone '\\r')."""
    with file.open("rb") as f:
        lines = sum(1 for line in f if line.strip(b"\r\n").strip(b" ")) - 1  # pandas skips blank lines
    if rows != lines:
        raise UsageError(
            f"{flag} {file} has {lines} lines of examples but reads as {rows} rows",
            "remove line breaks (e.g. a stray \\r) inside its fields",
        )


def _looks_like_jsonl(file: Path) -> bool:
    with file.open() as f:
        return not f.read(1).lstrip().startswith("[")


def _load_hub(args: DataArguments, cache_dir: str | None) -> DatasetDict:
    from datasets import load_dataset

    try:
        return load_dataset(args.dataset_name, args.dataset_config_name, cache_dir=cache_dir)
    except Exception as exc:  # the hub raises many types (ConnectionError, FileNotFoundError, ...)
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise UsageError(
            f"cannot load dataset {args.dataset_name!r} ({reason})",
            "use --train_file, --dataset_name synthetic-nli, or a hub name with network access",
        ) from None


def _from_glue_columns(dataset: Dataset) -> tuple[Dataset, str]:
    """GLUE's sentence1/sentence2/gold_label as premise/hypothesis/label; also returns the label's source column."""
    columns = set(dataset.column_names)
    if columns.isdisjoint(GLUE_COLUMNS.values()) and columns.issuperset(GLUE_COLUMNS):
        return dataset.select_columns(list(GLUE_COLUMNS)).rename_columns(GLUE_COLUMNS), "gold_label"
    return dataset, LABEL_COLUMN


def _label_names_to_ids(dataset: Dataset, where: str, num_labels: int) -> Dataset:
    """String labels ("entailment", ...) as ids in the order of the label names (multi_nli's, for 3 labels)."""
    if getattr(dataset.features[LABEL_COLUMN], "dtype", None) not in ("string", "large_string"):
        return dataset
    names = synthetic.LABEL_NAMES if num_labels == len(synthetic.LABEL_NAMES) else ()
    ids = {label: i for i, label in enumerate(names)}
    labels = dataset[LABEL_COLUMN]
    unknown = [(label, n) for label, n in Counter(labels).most_common() if label not in ids]
    if unknown:
        known = ", ".join(names) or f"none for --num_labels {num_labels}"
        shown = ", ".join(f"{label!r} ({n})" for label, n in unknown[:5])
        raise UsageError(
            f"{where} has label(s) that are not label names ({known}): {shown}",
            f"drop those rows or use integer labels 0..{num_labels - 1}",
        )
    return dataset.remove_columns(LABEL_COLUMN).add_column(LABEL_COLUMN, [ids[label] for label in labels])


def check_split(dataset: Dataset, name: str, num_labels: int) -> Dataset:
    """Keep premise/hypothesis/label, refusing data that cannot train a num_labels classifier."""
    dataset, label_column = _from_glue_columns(dataset)
    missing = [c for c in (*TEXT_COLUMNS, LABEL_COLUMN) if c not in dataset.column_names]
    if missing:
        raise UsageError(
            f"{name} data lacks column(s) {', '.join(missing)} (has: {', '.join(dataset.column_names)})",
            "provide premise, hypothesis and label columns (or GLUE's sentence1, sentence2 and gold_label)",
        )
    dataset = dataset.select_columns([*TEXT_COLUMNS, LABEL_COLUMN])
    if len(dataset) == 0:
        raise UsageError(f"{name} data has no examples", "provide at least one example")
    dataset = _label_names_to_ids(dataset, f"{name} data column {label_column}", num_labels)
    labels = dataset.unique(LABEL_COLUMN)
    bad = [v for v in labels if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < num_labels]
    if bad:
        raise UsageError(
            f"{name} data has label(s) {sorted(map(str, bad))[:5]} outside 0..{num_labels - 1}",
            f"use integer labels 0..{num_labels - 1} or set --num_labels",
        )
    for column in TEXT_COLUMNS:
        if any(not isinstance(v, str) for v in dataset.unique(column)):
            raise UsageError(f"{name} data has empty or non-text {column} values", f"fill every {column} cell")
    return dataset


def load_raw_datasets(args: DataArguments, seed: int, cache_dir: str | None = None) -> DatasetDict:
    validation: Dataset | None = None
    if args.train_file:
        train = _read_file(args.train_file, "--train_file")
        if args.validation_file:
            validation = _read_file(args.validation_file, "--validation_file")
    elif args.dataset_name == SYNTHETIC:
        train = Dataset.from_list(synthetic.generate(args.synthetic_num_examples, seed))
    elif args.dataset_name:
        hub = _load_hub(args, cache_dir)
        train = hub["train"]
        if args.validation_split_name:
            if args.validation_split_name not in hub:
                raise UsageError(
                    f"dataset {args.dataset_name!r} has no split {args.validation_split_name!r}",
                    f"use one of {', '.join(hub)}",
                )
            validation = hub[args.validation_split_name]
    else:
        raise UsageError("no training data given", "pass --dataset_name or --train_file")

    train = check_split(train, "train", args.num_labels)
    if validation is None:
        if len(train) < 2:
            raise UsageError("train data has too few examples to hold out a validation set", "add examples")
        split = train.train_test_split(
            test_size=args.validation_split_percentage / 100, seed=SPLIT_SEED, keep_in_memory=True
        )
        train, validation = split["train"], split["test"]
    else:
        validation = check_split(validation, "validation", args.num_labels)
    if args.max_train_samples is not None:
        train = train.select(range(min(args.max_train_samples, len(train))), keep_in_memory=True)
    if args.max_eval_samples is not None:
        validation = validation.select(range(min(args.max_eval_samples, len(validation))), keep_in_memory=True)
    if len(train) == 0 or len(validation) == 0:
        raise UsageError("train or validation data is empty after --max_*_samples", "raise the limits")
    return DatasetDict(train=train, validation=validation)


def content_digest(*parts: object) -> str:
    """A digest of datasets (by their Arrow content) and plain values, the same on every rank."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Dataset):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, part.data.table.schema) as writer:
                writer.write_table(part.flatten_indices(keep_in_memory=True).data.table)
            h.update(sink.getvalue().to_pybytes())
        else:
            h.update(repr(part).encode())
    return h.hexdigest()[:20]


def tokenized_cache_path(
    raw: DatasetDict, tokenizer: PreTrainedTokenizerBase, max_seq_length: int, cache_dir: Path
) -> Path:
    vocab = sorted(tokenizer.get_vocab().items())
    digest = content_digest(raw["train"], raw["validation"], vocab, type(tokenizer).__name__, max_seq_length)
    return cache_dir / "tokenized" / digest


def tokenize_to_disk(raw: DatasetDict, tokenizer: PreTrainedTokenizerBase, max_seq_length: int, target: Path) -> None:
    if target.is_dir():
        return

    def encode(batch: dict) -> dict:
        return tokenizer(*(batch[c] for c in TEXT_COLUMNS), truncation=True, max_length=max_seq_length)

    encoded = raw.map(encode, batched=True, remove_columns=list(TEXT_COLUMNS), keep_in_memory=True)
    encoded = encoded.rename_column(LABEL_COLUMN, "labels")
    with atomic_directory(target) as tmp:
        encoded.save_to_disk(str(tmp))


def load_tokenized(path: Path) -> DatasetDict:
    return load_from_disk(str(path))


class ResumableDistributedSampler(DistributedSampler):
    """A DistributedSampler that can start inside an epoch (resuming a checkpoint mid-epoch).

    The trainer drives every training sampler through ``begin_epoch`` and ``record_step``, so an
    engine may substitute its own (Horovod elastic re-shards the rest of an epoch on a resize)."""

    skip = 0  # indices of this rank's shard to skip in the current epoch

    def begin_epoch(self, epoch: int, samples_in_epoch: int) -> None:
        """Start ``epoch`` after the ``samples_in_epoch`` examples (all ranks together) already trained on."""
        self.set_epoch(epoch)
        self.skip = samples_in_epoch // self.num_replicas

    def record_step(self, samples_per_rank: int) -> None:
        """Called after each optimizer step; the position is kept by the trainer's step count."""

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return super().__len__() - self.skip


class LengthGroupedSampler(ResumableDistributedSampler):
    """DistributedSampler's sharding of an order in which each global batch holds examples of similar length.

    Each epoch (seeded by seed + epoch, the same on every rank): a permutation of the dataset, padded to a
    multiple of the world size by repeating its start exactly as DistributedSampler pads; cut into
    megabatches of ``megabatch_batches`` global batches, each sorted longest first; cut into global
    batches of ``batch_size`` x world size, whose order is shuffled (a last, partial one stays last).
    Rank r takes every world_size-th index, so a rank's k-th batch is its share of global batch k and
    the ranks' shards of an epoch partition the padded dataset, as with DistributedSampler."""

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
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        padding = self.total_size - len(order)
        order += (order * math.ceil(padding / len(order)))[:padding]
        grouped: list[int] = []
        for start in range(0, len(order), self.megabatch):
            grouped += sorted(order[start : start + self.megabatch], key=self.lengths.__getitem__, reverse=True)
        batches = [grouped[i : i + self.global_batch] for i in range(0, len(grouped), self.global_batch)]
        partial = batches.pop() if len(batches[-1]) < self.global_batch else None
        shuffled = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
        return [i for batch in shuffled + ([partial] if partial else []) for i in batch]

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
) -> DataLoader:
    """Rank r takes every world_size-th example of one seeded permutation, so the global batch of
    step k is the same contiguous slice of that permutation for every world size (see README).
    ``group_by_length`` reorders that permutation so a global batch holds examples of similar length."""
    if sampler is None and group_by_length:
        lengths = example_lengths(dataset)
        sampler = LengthGroupedSampler(dataset, lengths, batch_size, num_replicas=world_size, rank=rank, seed=seed)
    if sampler is None:
        sampler = ResumableDistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=DataCollatorWithPadding(tokenizer),
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
    dataset: Dataset, tokenizer: PreTrainedTokenizerBase, batch_size: int, world_size: int, rank: int
) -> DataLoader:
    """An unpadded strided shard: every example is evaluated exactly once over all ranks."""
    shard = dataset.add_column("example_index", list(range(len(dataset)))).select(
        range(rank, len(dataset), world_size), keep_in_memory=True
    )
    collate = DataCollatorWithPadding(tokenizer)
    return DataLoader(shard, batch_size=batch_size, shuffle=False, collate_fn=collate, generator=own_generator(0))
