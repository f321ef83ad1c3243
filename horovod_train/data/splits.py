"""A run's splits, as run_glue.py makes them: ``train``, the evaluation splits (``validation``, or 10% of the
train data held out) and the ``test*`` splits to predict, each with its columns and labels checked."""

from __future__ import annotations

import math

import numpy as np
from datasets import Dataset, DatasetDict

from horovod_train.common.errors import UsageError
from horovod_train.config.run_config import DataArguments
from horovod_train.data.columns import check_texts, from_glue_columns, origin, resolve_text_columns, select_columns
from horovod_train.data.labels import encode_labels, labels_as_written, resolve_label_names
from horovod_train.data.sources import Splits, read_sources
from horovod_train.tasks.base import LabelNames

SPLIT_SEED = 42  # the tutorials' 90/10 split of the train set


def _labels_origin(name: str, source: str, args: DataArguments) -> str:
    """A split's label column for messages: ``train data (train.csv) column label``."""
    return f"{origin(name, args)} column {source}"


def _selected(dataset: Dataset, name: str, text: list[str], args: DataArguments, labelled: bool):
    """The split's text columns and ``label`` (labels as written: see labels_as_written), checked; and the
    label's source column."""
    dataset, source = select_columns(dataset, name, text, args, labelled)
    dataset = labels_as_written(dataset, _labels_origin(name, source, args), args)
    check_texts(dataset, origin(name, args), text, labelled)
    return dataset, source


def _checked_split(
    dataset: Dataset, name: str, text: list[str], args: DataArguments, labels: LabelNames, labelled: bool
) -> Dataset:
    dataset, source = _selected(dataset, name, text, args, labelled)
    return encode_labels(dataset, _labels_origin(name, source, args), labels, unlabelled_ok=not labelled)


def _hold_out(train: Dataset, args: DataArguments) -> tuple[Dataset, Splits]:
    if len(train) < 2:
        raise UsageError("train data has too few examples to hold out a validation set", "add examples")
    # train_test_split's permutation, without its index cache files (written beside a save_to_disk directory)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(train))
    held_out = math.ceil(args.validation_split_percentage / 100 * len(train))
    validation = train.select(order[:held_out], keep_in_memory=True)
    return train.select(order[held_out:], keep_in_memory=True), {"validation": validation}


def _first(dataset: Dataset, limit: int | None) -> Dataset:
    return dataset if limit is None else dataset.select(range(min(limit, len(dataset))), keep_in_memory=True)


def load_raw_datasets(
    args: DataArguments, seed: int, cache_dir: str | None = None, model_labels: tuple[str, ...] | None = None
) -> DatasetDict:
    """``train``; one evaluation split ``validation``, or several named ``validation_*`` (the first is the
    primary); zero or more ``test*`` splits (labels -1 where missing). Each has the text columns
    (``text_columns``) and ``label``, a ClassLabel with the label names (in ``model_labels``' order where they are
    the pretrained model's)."""
    train, evals, tests = read_sources(args, seed, cache_dir)
    text = resolve_text_columns(from_glue_columns(train, args)[0], args)
    train, source = _selected(train, "train", text, args, labelled=True)
    labels = resolve_label_names(train, source, args, model_labels)
    train = encode_labels(train, _labels_origin("train", source, args), labels, unlabelled_ok=False)
    evals = {name: _checked_split(split, name, text, args, labels, True) for name, split in evals.items()}
    tests = {name: _checked_split(split, name, text, args, labels, False) for name, split in tests.items()}
    if not evals:
        train, evals = _hold_out(train, args)
    train = _first(train, args.max_train_samples)
    evals = {name: _first(split, args.max_eval_samples) for name, split in evals.items()}
    tests = {name: _first(split, args.max_predict_samples) for name, split in tests.items()}
    if len(train) == 0 or any(len(split) == 0 for split in evals.values()):
        raise UsageError("train or validation data is empty after --max_*_samples", "raise the limits")
    return DatasetDict({"train": train, **evals, **tests})


def eval_split_names(ds: DatasetDict) -> list[str]:
    """The evaluation splits, the primary one first."""
    return [name for name in ds if name.startswith("validation")]


def test_split_names(ds: DatasetDict) -> list[str]:
    return [name for name in ds if name.startswith("test")]
