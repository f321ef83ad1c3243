"""Data: hub datasets, save_to_disk directories, local files and synthetic-nli, all through one
validate/tokenize/collate path. Text columns and label names are resolved as transformers' run_glue.py and
run_classification.py do (horovod_train/glue.py has the GLUE tasks)."""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import math
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from datasets import ClassLabel, Dataset, DatasetDict, LargeList, List, Value, load_from_disk
from torch.utils.data import DataLoader, DistributedSampler, Sampler
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from horovod_train import glue, glue_files, synthetic
from horovod_train.config import DataArguments
from horovod_train.errors import UsageError
from horovod_train.files import atomic_directory
from horovod_train.metrics import MULTI_LABEL, REGRESSION, SINGLE_LABEL

TEXT_COLUMNS = ("premise", "hypothesis")  # the NLI columns (synthetic-nli, multi_nli); text_columns() has a run's
AUTO_TEXT_COLUMNS = (("premise", "hypothesis"), ("sentence1", "sentence2"), ("sentence",), ("text",))
LABEL_COLUMN = "label"
SPLIT_SEED = 42  # the tutorials' 90/10 split of the train set
SYNTHETIC = "synthetic-nli"
FILE_SEPARATORS = {".csv": ",", ".tsv": "\t"}
FILE_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".parquet")
Splits = dict[str, Dataset]
DIGEST_BATCH_ROWS = 10_000


def default_cache_dir() -> Path:
    return Path(os.environ.get("HOROVOD_TRAIN_CACHE", Path.home() / ".cache" / "horovod-train"))


def _read_file(path: str, flag: str, cache_dir: Path, task_name: str | None = None) -> Dataset:
    """A data file as a memory-mapped Dataset, through the ``datasets`` builder of its format (an Arrow copy
    cached under ``cache_dir``/files, built once: each node's local main rank reads first, see
    training/build.py). A file the builder refuses, or one without rows, is read again in memory as before,
    for its exact message (or its rows: pandas also reads a CSV whose chunks infer other types)."""
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise UsageError(f"{flag} {path} has unsupported extension {suffix!r}", "use .csv, .tsv, .json, .jsonl "
                         "or .parquet")  # fmt: skip
    if not file.is_file():
        raise UsageError(f"{flag} {path} does not exist", f"pass an existing file to {flag}")
    names = glue_files.headerless_columns(task_name, file)
    dataset = _build(file, names, cache_dir)
    if dataset is None:
        dataset = _read_into_memory(file, flag, names)
    if len(dataset) == 0:  # a header alone, or [] (an empty test split would predict nothing)
        raise UsageError(
            f"{flag} {path} has no examples",
            "add examples to it, or drop --test_file" if flag == "--test_file" else "add examples to it",
        )
    if suffix == ".tsv":
        _check_one_row_per_line(file, len(dataset), flag, header=names is None)
    return glue_files.without_bom(dataset)


def _builder_arguments(suffix: str, names: list[str] | None) -> tuple[str, dict]:
    """The ``datasets`` builder of a file's format and its options."""
    if suffix not in FILE_SEPARATORS:
        return ("parquet" if suffix == ".parquet" else "json"), {}
    # TSV (GLUE's included) is not quoted: a '"' in a text is a character, not the start of a quoted field.
    # Only an empty cell is missing: a text "NA", "None" or "null" stays text.
    options = dict(sep=FILE_SEPARATORS[suffix], quoting=csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL,
                   keep_default_na=False, na_values=[""])  # fmt: skip
    if names:
        options.update(column_names=names, header=None)
    return "csv", options


def _build(file: Path, names: list[str] | None, cache_dir: Path) -> Dataset | None:
    """The builder's Dataset of ``file``; None if it refuses the file or reads no rows."""
    from datasets import load_dataset

    builder, options = _builder_arguments(file.suffix.lower(), names)
    try:
        dataset = load_dataset(builder, data_files={"train": str(file.resolve())}, split="train",
                               cache_dir=str(cache_dir / "files"), **options)  # fmt: skip
    except Exception:  # noqa: BLE001 - the builders raise many types; the in-memory reader names the problem
        return None
    # A JSON column of several kinds of values comes as JSON text (an Arrow extension type): refused in memory.
    mixed = any(isinstance(field.type, pa.BaseExtensionType) for field in dataset.data.schema)
    return dataset if len(dataset) and not mixed else None


def _read_into_memory(file: Path, flag: str, names: list[str] | None) -> Dataset:
    """The file through pandas, checked: every value of a column of one kind."""
    import pandas as pd

    suffix = file.suffix.lower()
    try:
        if suffix == ".parquet":
            frame = pd.read_parquet(file)
        elif suffix not in FILE_SEPARATORS:
            # dtype=False: the values as written (inference would turn a true among integer labels into 1)
            frame = pd.read_json(file, lines=suffix == ".jsonl" or _looks_like_jsonl(file), dtype=False)
        else:
            options = _builder_arguments(suffix, names)[1]
            options["names"] = options.pop("column_names", None)
            frame = pd.read_csv(file, **options)
    except pd.errors.EmptyDataError:
        raise UsageError(f"{flag} {file} is empty", "give it a header and at least one example") from None
    except (ValueError, pd.errors.ParserError, OSError) as exc:
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise UsageError(f"{flag} {file} cannot be parsed ({reason})", "fix the file's format") from None
    for column in frame.columns:
        _check_one_kind(frame[column].tolist(), f"{flag} {file}", column)
    return Dataset.from_pandas(frame, preserve_index=False)


def _kind(value: object) -> str | None:
    """What a JSON/CSV value is, for messages; None for a missing one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float | np.number):
        return "number"
    if isinstance(value, str):
        return "text"
    return {list: "list", dict: "mapping"}.get(type(value), type(value).__name__)


def _check_one_kind(values: list, where: str, column: str) -> None:
    """A column holds one kind of value: the first value of its rarest kind is named (row counted from 1)."""
    kinds = [_kind(v) for v in values]
    counts = Counter(k for k in kinds if k is not None)
    if len(counts) < 2:
        return
    rare, common = counts.most_common()[-1][0], counts.most_common(1)[0][0]
    row = kinds.index(rare)
    raise UsageError(
        f"{where} row {row + 1} column {column!r} holds {values[row]!r} (a {rare}) where its other rows hold "
        f"{common} values",
        f"give every row of column {column!r} a {common} value (quote numbers meant as text)",
    )


def _check_one_row_per_line(file: Path, rows: int, flag: str, header: bool = True) -> None:
    """Each non-blank line after the header must be one example (pandas also ends a row at a lone '\\r')."""
    with file.open("rb") as f:
        lines = sum(1 for line in f if line.strip(b"\r\n").strip(b" ")) - header  # pandas skips blank lines
    if rows != lines:
        raise UsageError(
            f"{flag} {file} has {lines} lines of examples but reads as {rows} rows",
            "remove line breaks (e.g. a stray \\r) inside its fields",
        )


def _looks_like_jsonl(file: Path) -> bool:
    with file.open() as f:
        return not f.read(1).lstrip().startswith("[")


def _sources(args: DataArguments, seed: int, cache_dir: str | None) -> tuple[Dataset, Splits, Splits]:
    """(train, evaluation splits, test splits) as given, before any column or label is checked."""
    evals: Splits = {}
    tests: Splits = {}
    files = Path(cache_dir) if cache_dir else default_cache_dir()
    if args.train_file:
        train = _read_file(args.train_file, "--train_file", files, args.task_name)
        if args.validation_file:
            evals["validation"] = _read_file(args.validation_file, "--validation_file", files, args.task_name)
    elif args.dataset_name == SYNTHETIC and not args.task_name:
        rows = synthetic.generate(args.synthetic_num_examples, seed)
        names = ClassLabel(names=list(synthetic.LABEL_NAMES))
        train = Dataset.from_list(rows).remove_columns(LABEL_COLUMN)
        train = train.add_column(LABEL_COLUMN, [row[LABEL_COLUMN] for row in rows], feature=names)
    elif args.dataset_name or args.task_name:
        # --task_name alone (the default synthetic-nli untouched) means GLUE from the hub, as in run_glue.py.
        name = args.dataset_name if args.dataset_name not in (None, SYNTHETIC) else glue.HUB_DATASET
        train, evals, tests = glue.pick_splits(glue.load_source(args, cache_dir, name), name, args)
    else:
        raise UsageError("no training data given", "pass --dataset_name, --train_file or --task_name")
    if args.test_file:
        tests["test"] = _read_file(args.test_file, "--test_file", files, args.task_name)
    return train, evals, tests


def _from_glue_columns(
    dataset: Dataset, args: DataArguments, text: list[str] | None = None
) -> tuple[Dataset, str, str]:
    """GLUE's distributed .tsv layouts (glue_files: MRPC's ``#1 String``, QQP's ``is_duplicate``, STS-B's
    ``score``, MNLI's ``gold_label``, ...) under run_glue's column names, unless the columns are named by flags;
    also returns the label column and the name it has in the user's data. Given the run's ``text`` columns
    (the train data's), a split is read in a layout only where that gives it those columns: a test file of
    sentence1, sentence2 beside a train file of sentence1, sentence2, label keeps its columns."""
    named = args.text_column_names or args.label_column_name != LABEL_COLUMN
    layout = None if named else glue_files.layout_of(dataset.column_names, args.task_name)
    if layout is None or (text is not None and not set(text) <= set(layout.values())):
        return dataset, args.label_column_name, args.label_column_name
    dataset, source = glue_files.to_task_columns(dataset, layout)
    return dataset, LABEL_COLUMN, source


def resolve_text_columns(train: Dataset, args: DataArguments) -> list[str]:
    """--text_column_names, else the task's columns, else the first of AUTO_TEXT_COLUMNS the data has."""
    named = args.text_columns()
    if named:
        return named
    if args.task_name:
        return glue.task_text_columns(args.task_name)
    for candidate in AUTO_TEXT_COLUMNS:
        if set(candidate) <= set(train.column_names):
            return list(candidate)
    raise UsageError(
        "train data has no text column: none of premise+hypothesis, sentence1+sentence2, sentence or text "
        f"(has: {', '.join(train.column_names)})",
        "pass --text_column_names with one or two of its columns (comma-separated), or --task_name",
    )


def _column_fix(missing: str, label: str, args: DataArguments) -> str:
    if missing == label:
        return "pass --label_column_name with its label column"
    if args.text_column_names:
        return "pass --text_column_names with one or two of its columns (comma-separated)"
    if args.task_name:
        return f"rename its columns to --task_name {args.task_name}'s, or pass --text_column_names"
    return "give every split the train data's text columns, or pass --text_column_names"


def _select_columns(dataset: Dataset, name: str, text: list[str], args: DataArguments, labelled: bool):
    """The text columns and ``label`` (the label column renamed; -1 when a test split has none), and the
    label's source column."""
    dataset, label, source = _from_glue_columns(dataset, args, text)
    required = [*text, label] if labelled else text
    missing = next((column for column in required if column not in dataset.column_names), None)
    if missing is not None:
        raise UsageError(
            f"{name} data has no column {missing!r} (has: {', '.join(dataset.column_names)})",
            _column_fix(missing, label, args),
        )
    if label in text:
        raise UsageError(f"--label_column_name {label} is also a text column", "name the label column")
    if label not in dataset.column_names:
        return dataset.select_columns(text).add_column(LABEL_COLUMN, [-1] * len(dataset)), source
    dataset = dataset.select_columns([*text, label])
    dataset = dataset.rename_column(label, LABEL_COLUMN) if label != LABEL_COLUMN else dataset
    return _labels_as_written(dataset, f"{origin(name, args)} column {source}", args), source


def origin(name: str, args: DataArguments) -> str:
    """A split for messages: ``train data``, with the file it was read from if any."""
    files = {"train": args.train_file, "validation": args.validation_file if args.train_file else None,
             "test": args.test_file}  # fmt: skip
    return f"{name} data ({files[name]})" if files.get(name) else f"{name} data"


def _check_texts(dataset: Dataset, where: str, text: list[str], labelled: bool) -> None:
    """Every text cell holds text: checked on the Arrow columns, without reading them into Python."""
    if labelled and len(dataset) == 0:
        raise UsageError(f"{where} has no examples", "provide at least one example")
    columns = dataset.with_format("arrow")
    for column in text:
        values = columns[column]
        is_text = pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
        if is_text and values.null_count == 0:
            continue
        row = pc.index(pc.is_null(values), True).as_py() if is_text else 0
        raise UsageError(
            f"{where} has empty or non-text {column} values (row {row + 1} holds {values[row].as_py()!r})",
            f"fill every {column} cell with text",
        )


# What labels written as text hold (a CSV reads a column as text where one cell is not a number), for messages
LABEL_TEXT_KINDS = {"number": "numbers", "name": "label names", "list": "lists of labels"}
LABEL_TEXT_FIXES = {
    "number": "use either numbers or label names in a label column, not both (no label: an empty cell in test "
    "data; drop such examples from training data)",
    "name": "use either numbers or label names in a label column, not both",
    "list": 'write every label cell as a JSON list, e.g. ["sports", "politics"] ([] for none)',
}


def _label_text_kind(value: object) -> str | None:
    """What a label written as text is: a JSON list ('["tech"]': a CSV cannot hold lists), a finite number
    ('3.8', '2'), else a label name; None for a missing one."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        parsed = json.loads(text) if text.startswith("[") else float(text)
    except ValueError:
        return "name"
    if isinstance(parsed, list):
        return "list"
    return "number" if isinstance(parsed, float) and math.isfinite(parsed) else "name"


def _check_label_texts(values: list, where: str) -> set[str]:
    """Labels written as text are all numbers, all names or all lists; a mix ('0', '1', 'x'; '3.8', 'n/a') is
    a mistake: the first row of the rarer kind is named. Returns the kinds found."""
    kinds = [_label_text_kind(v) for v in values]
    counts = Counter(kind for kind in kinds if kind is not None)
    if len(counts) > 1:
        (common, _), *_, (rare, _) = counts.most_common()
        row = kinds.index(rare)
        raise UsageError(
            f"{where} row {row + 1} holds {values[row]!r} where its other rows hold {LABEL_TEXT_KINDS[common]}",
            LABEL_TEXT_FIXES[common],
        )
    return set(counts)


def _regression_by_flags(args: DataArguments) -> bool:
    return args.task_name in glue.REGRESSION_TASKS or args.num_labels == 1


def _labels_as_written(dataset: Dataset, where: str, args: DataArguments) -> Dataset:
    """A label column of text checked to hold one kind of label (_check_label_texts), its JSON lists read as
    lists (multi-label, as a JSON file's lists). A regression by flags reads each label as a number itself."""
    if not _is_string(dataset.features[LABEL_COLUMN]) or _regression_by_flags(args):
        return dataset
    values = list(dataset[LABEL_COLUMN])
    if "list" not in _check_label_texts(values, where):
        return dataset
    lists = [None if v is None else json.loads(v) for v in values]
    return _replace_labels(dataset, lists, List(Value(_list_label_type(lists, values, where))))


def _list_label_type(lists: list[list | None], values: list, where: str) -> str:
    """The type of the labels in lists read from text: all names or all integer ids, as in a JSON file."""
    labels = [label for cell in lists for label in cell or ()]
    first = type(labels[0]) if labels else str
    if first in (str, int) and all(type(label) is first for label in labels):
        return "string" if first is str else "int64"
    row = next(i for i, cell in enumerate(lists) if any(type(x) is not first or first not in (str, int)
                                                        for x in cell or ()))  # fmt: skip
    raise UsageError(
        f"{where} row {row + 1} holds {values[row]!r}: a list's labels must all be names or all integer ids",
        'write every list\'s labels as names (["sports"]) or as integer ids ([0]), the same in every row',
    )


@dataclass(frozen=True)
class LabelNames:
    names: tuple[str, ...]
    origin: str  # where the names come from, for messages
    problem_type: str = SINGLE_LABEL  # transformers' config.problem_type


REGRESSION_NAMES = ("LABEL_0",)  # transformers' id2label for num_labels=1


def _is_string(feature: object) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


def _is_float(feature: object) -> bool:
    return getattr(feature, "dtype", None) in ("float16", "float32", "float64")


def _nli_names(labels: set[str]) -> bool:
    """multi_nli's names: all the labels are among them, or (a '-' or typo aside) two or more of them are."""
    known = set(synthetic.LABEL_NAMES)
    return labels <= known or len(labels & known) >= 2


def _is_regression(train: Dataset, args: DataArguments) -> bool:
    """--task_name stsb, --num_labels 1, or numeric labels of which one is not a whole number: floats, or
    numbers written as text (JSON strings such as "3.8")."""
    if _regression_by_flags(args):
        return True
    feature = train.features[LABEL_COLUMN]
    values = [v for v in train.unique(LABEL_COLUMN) if v is not None]
    if _is_string(feature) and all(_label_text_kind(v) == "number" for v in values):
        values = [float(v) for v in values]
    elif not _is_float(feature):
        return False
    return any(math.isfinite(v) and not v.is_integer() for v in values)


def _multi_label_names(train: Dataset, source: str, args: DataArguments) -> LabelNames:
    """A list of labels per example: the ClassLabel's names; for names, the sorted distinct names (as
    run_classification.py); for integers, --num_labels or the largest id + 1."""
    inner = train.features[LABEL_COLUMN].feature
    cells = [cell for cell in train[LABEL_COLUMN] if isinstance(cell, list)]
    values = {v for cell in cells for v in cell if v is not None}
    if not values:
        raise UsageError(
            f"train data column {source} holds lists of labels, all empty: no example has a label",
            'give each example the labels it has, e.g. ["sports", "politics"] ([] only for one that has none)',
        )
    if isinstance(inner, ClassLabel):
        return LabelNames(tuple(inner.names), f"the ClassLabel names of {source}", MULTI_LABEL)
    if _is_string(inner):
        return LabelNames(tuple(sorted(values)), "the train data's distinct labels", MULTI_LABEL)
    ids = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    count = args.num_labels or (max(ids) + 1 if ids else 0)
    origin = f"--num_labels {count}" if args.num_labels else f"integer labels 0..{count - 1}"
    return LabelNames(tuple(f"LABEL_{i}" for i in range(count)), origin, MULTI_LABEL)


def _single_label_names(train: Dataset, source: str, args: DataArguments) -> LabelNames:
    """A ClassLabel's names; the task's; for string labels multi_nli's or the sorted distinct labels (as
    run_classification.py); for integer labels --num_labels or their distinct count (multi_nli's names for 3)."""
    feature = train.features[LABEL_COLUMN]
    if isinstance(feature, ClassLabel):
        return LabelNames(tuple(feature.names), f"the ClassLabel names of {source}")
    if args.task_name in glue.TASK_LABEL_NAMES:
        return LabelNames(glue.TASK_LABEL_NAMES[args.task_name], f"--task_name {args.task_name}'s names")
    if _is_string(feature):
        values = {v for v in train.unique(LABEL_COLUMN) if v is not None}
        nli = _nli_names(values)
        names = synthetic.LABEL_NAMES if nli else tuple(sorted(values))
        return LabelNames(names, "the multi_nli names" if nli else "the train data's distinct labels")
    count = args.num_labels or len(train.unique(LABEL_COLUMN))
    names = synthetic.LABEL_NAMES if count == 3 else tuple(f"LABEL_{i}" for i in range(count))
    return LabelNames(names, f"--num_labels {count}" if args.num_labels else f"{count} distinct integer labels")


def resolve_label_names(train: Dataset, source: str, args: DataArguments) -> LabelNames:
    """The task's shape and label names: multi-label for a list of labels per example, regression (one
    value, LABEL_0) for --task_name stsb, --num_labels 1 or fractional float labels, else classification."""
    if isinstance(train.features[LABEL_COLUMN], List | LargeList):
        found = _multi_label_names(train, source, args)
    elif _is_regression(train, args):
        origin = f"--task_name {args.task_name}" if args.task_name in glue.REGRESSION_TASKS else "float labels"
        found = LabelNames(REGRESSION_NAMES, "--num_labels 1" if args.num_labels == 1 else origin, REGRESSION)
    else:
        found = _single_label_names(train, source, args)
    if args.num_labels is not None and args.num_labels != len(found.names):
        raise UsageError(
            f"--num_labels {args.num_labels} but the train data has {len(found.names)} labels "
            f"({', '.join(found.names[:10])}: {found.origin})",
            "drop --num_labels (it is inferred from the data)",
        )
    if len(found.names) < 2 and found.problem_type != REGRESSION:
        raise UsageError(
            f"train data column {source} has a single label ({', '.join(map(str, found.names))})",
            "a classifier needs examples of two or more labels (check --label_column_name; --num_labels 1 "
            "for a regression)",
        )
    return found


def _as_id(value: object, unlabelled_ok: bool) -> int | None:
    """An integer label's id; -1 for a missing one where allowed; None for anything else."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return -1 if unlabelled_ok else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, float) and value.is_integer() else None


def _ids_of_names(values: list, where: str, labels: LabelNames, unlabelled_ok: bool) -> list[int]:
    ids = {name: i for i, name in enumerate(labels.names)}
    unknown = Counter(v for v in values if v not in ids and not (unlabelled_ok and v is None))
    if unknown:
        shown = ", ".join(f"{label!r} ({n})" for label, n in unknown.most_common(5))
        from_train = labels.origin.startswith("the train data")
        raise UsageError(
            f"{where} has label(s) that are not label names ({', '.join(labels.names)}; {labels.origin}): {shown}",
            "add examples of them to the train data, or drop those rows"
            if from_train
            else f"drop those rows or use integer labels 0..{len(labels.names) - 1}",
        )
    return [ids.get(v, -1) for v in values]


def encode_labels(dataset: Dataset, where: str, labels: LabelNames, unlabelled_ok: bool) -> Dataset:
    """The label column as ``labels``'s shape holds it: a ClassLabel id (-1, no label, only where
    ``unlabelled_ok``: test splits), a float32 (regression; NaN for no label) or a list of ClassLabel ids
    (multi-label; the collator makes it multi-hot)."""
    values = list(dataset[LABEL_COLUMN])
    if labels.problem_type == REGRESSION:
        floats = [_regression_value(v, i, where, labels, unlabelled_ok) for i, v in enumerate(values)]
        return _replace_labels(dataset, floats, Value("float32"))
    names, feature = list(labels.names), dataset.features[LABEL_COLUMN]
    if labels.problem_type == MULTI_LABEL:
        inner = getattr(feature, "feature", None)
        lists = [_label_list(v, i, where, inner, unlabelled_ok) for i, v in enumerate(values)]
        textual = _is_string(inner) or isinstance(inner, ClassLabel)  # a ClassLabel's ids came back as names
        ids = iter(_class_ids([v for cell in lists for v in cell], textual, where, labels, unlabelled_ok=False))
        id_lists = [sorted({next(ids) for _ in cell}) for cell in lists]
        return _replace_labels(dataset, id_lists, List(ClassLabel(names=names)))
    if isinstance(feature, ClassLabel) and tuple(feature.names) != labels.names:
        raise UsageError(
            f"{where} has label names ({', '.join(feature.names)}) other than the train data's "
            f"({', '.join(labels.names)})",
            "give every split the same ClassLabel names",
        )
    ids = _class_ids(values, _is_string(feature), where, labels, unlabelled_ok)
    return _replace_labels(dataset, ids, ClassLabel(names=names))


def _replace_labels(dataset: Dataset, values: list, feature: object) -> Dataset:
    return dataset.remove_columns(LABEL_COLUMN).add_column(LABEL_COLUMN, values, feature=feature)


def _class_ids(values: list, textual: bool, where: str, labels: LabelNames, unlabelled_ok: bool) -> list[int]:
    """Each value's class id: a label name's (``textual``), or an integer label in 0..n-1."""
    if textual:
        _check_label_texts(values, where)
        return _ids_of_names(values, where, labels, unlabelled_ok)
    n = len(labels.names)
    ids = [_as_id(v, unlabelled_ok) for v in values]
    lowest = -1 if unlabelled_ok else 0
    bad = {str(v) for v, i in zip(values, ids, strict=True) if i is None or not lowest <= i < n}
    if bad:
        raise UsageError(
            f"{where} has label(s) {sorted(bad)[:5]} outside 0..{n - 1} ({labels.origin})",
            f"use integer labels 0..{n - 1} or label names, or set --num_labels",
        )
    return ids


def _regression_value(value: object, row: int, where: str, labels: LabelNames, unlabelled_ok: bool) -> float:
    """A regression label as a float: a number, or a text that is one ('3.8' in a CSV read as text)."""
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    if missing and unlabelled_ok:
        return math.nan
    number = None
    if isinstance(value, int | float | np.number) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):
        raise UsageError(
            f"{where} row {row + 1} holds {value!r}, which is not a number (a regression label: {labels.origin})",
            "give every labelled row a finite number (e.g. 3.8), or train a classification task",
        )
    return number


def _label_list(value: object, row: int, where: str, inner: object, unlabelled_ok: bool) -> list:
    """A multi-label cell: a list of label names or ids (a ClassLabel's ids as its names); [] for no label."""
    if unlabelled_ok and (value is None or value == -1):
        return []
    if not isinstance(value, list):
        raise UsageError(
            f"{where} row {row + 1} holds {value!r}, which is not a list of labels (the train data's labels are "
            "lists: multi-label)",
            'write every label cell as a list, e.g. ["sports", "politics"] ([] for none)',
        )
    return [inner.int2str(v) for v in value] if isinstance(inner, ClassLabel) else value


def _checked_split(
    dataset: Dataset, name: str, text: list[str], args: DataArguments, labels: LabelNames, labelled: bool
) -> Dataset:
    dataset, source = _select_columns(dataset, name, text, args, labelled)
    _check_texts(dataset, origin(name, args), text, labelled)
    return encode_labels(dataset, f"{origin(name, args)} column {source}", labels, unlabelled_ok=not labelled)


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


def load_raw_datasets(args: DataArguments, seed: int, cache_dir: str | None = None) -> DatasetDict:
    """``train``; one evaluation split ``validation``, or several named ``validation_*`` (the first is the
    primary); zero or more ``test*`` splits (labels -1 where missing). Each has the text columns
    (``text_columns``) and ``label``, a ClassLabel with the label names."""
    train, evals, tests = _sources(args, seed, cache_dir)
    text = resolve_text_columns(_from_glue_columns(train, args)[0], args)
    train, source = _select_columns(train, "train", text, args, labelled=True)
    _check_texts(train, origin("train", args), text, labelled=True)
    labels = resolve_label_names(train, source, args)
    train = encode_labels(train, f"{origin('train', args)} column {source}", labels, unlabelled_ok=False)
    evals = {name: _checked_split(split, name, text, args, labels, True) for name, split in evals.items()}
    tests = {name: _checked_split(split, name, text, args, labels, False) for name, split in tests.items()}
    if not evals:
        train, evals = _hold_out(train, args)
    train = _first(train, args.max_train_samples)
    evals = {name: _first(split, args.max_eval_samples) for name, split in evals.items()}
    if len(train) == 0 or any(len(split) == 0 for split in evals.values()):
        raise UsageError("train or validation data is empty after --max_*_samples", "raise the limits")
    return DatasetDict({"train": train, **evals, **tests})


def eval_split_names(ds: DatasetDict) -> list[str]:
    """The evaluation splits, the primary one first."""
    return [name for name in ds if name.startswith("validation")]


def test_split_names(ds: DatasetDict) -> list[str]:
    return [name for name in ds if name.startswith("test")]


def text_columns(ds: DatasetDict) -> list[str]:
    """The text columns of a load_raw_datasets result, in the order the tokenizer takes them."""
    return [column for column in ds["train"].column_names if column != LABEL_COLUMN]


def _label_feature(ds: DatasetDict) -> object:
    features = ds["train"].features
    return features["labels" if "labels" in features else LABEL_COLUMN]


def label_names(ds: DatasetDict) -> list[str]:
    """The label names of a load_raw_datasets (``label``) or tokenized (``labels``) result (a regression's
    one output is LABEL_0, as transformers names it)."""
    feature = _label_feature(ds)
    if isinstance(feature, List | LargeList):
        return list(feature.feature.names)
    return list(feature.names) if isinstance(feature, ClassLabel) else list(REGRESSION_NAMES)


def problem_type(ds: DatasetDict) -> str:
    """transformers' config.problem_type of a load_raw_datasets or tokenized result, from its label feature."""
    feature = _label_feature(ds)
    if isinstance(feature, List | LargeList):
        return MULTI_LABEL
    return SINGLE_LABEL if isinstance(feature, ClassLabel) else REGRESSION


def task_line(ds: DatasetDict) -> str:
    """What the labels made of the run (inferred from their values unless flags say), for rank 0's log."""
    kind, names = problem_type(ds), label_names(ds)
    if kind == REGRESSION:
        return "task: regression (one number per example)"
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    return f"task: {kind} over {len(names)} labels ({shown})"


def content_digest(*parts: object) -> str:
    """A digest of datasets (by their Arrow content) and plain values, the same on every rank. A dataset is
    hashed a batch of rows at a time, so that a split larger than memory is not copied into it."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Dataset):
            for batch in part.with_format("arrow").iter(batch_size=DIGEST_BATCH_ROWS):
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema) as writer:
                    writer.write_table(batch)
                h.update(sink.getvalue())
            h.update(f"rows:{len(part)};".encode())
        else:
            h.update(repr(part).encode())
    return h.hexdigest()[:20]


def tokenized_cache_path(
    raw: DatasetDict, tokenizer: PreTrainedTokenizerBase, max_seq_length: int, cache_dir: Path, pad: bool = False
) -> Path:
    """The tokenized splits' cache entry, keyed by everything their ids depend on: each split's content (its
    text columns, in order, and labels), the label names, the tokenizer (tokenizer_digest), the length and,
    padded to it in the cache, the pad id, type id and side."""
    splits = [part for name in raw for part in (name, raw[name])]
    padding = (tokenizer.pad_token_id, tokenizer.pad_token_type_id, tokenizer.padding_side) if pad else None
    digest = content_digest(*splits, label_names(raw), tokenizer_digest(tokenizer), max_seq_length, padding)
    return cache_dir / "tokenized" / digest


def tokenize_to_disk(
    raw: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    max_seq_length: int,
    target: Path,
    pad: bool = False,
    overwrite: bool = False,
    num_proc: int | None = None,
) -> None:
    """Tokenize every split into ``target`` unless it is there (``overwrite``: again). ``pad``: every
    example to ``max_seq_length`` (run_glue's --pad_to_max_length), else the collator pads per batch.
    ``num_proc`` processes tokenize contiguous shards (run_glue's --preprocessing_num_workers): the same
    data as one. The tokenized splits go through files beside ``target``, never into memory whole."""
    if target.is_dir() and not overwrite:
        return
    columns = text_columns(raw)
    encode = encoder(tokenizer, columns, max_seq_length, pad)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.", suffix=".map") as work:
        files = {name: str(Path(work) / f"{name}.arrow") for name in raw}
        encoded = raw.map(encode, batched=True, remove_columns=columns, num_proc=num_proc if num_proc != 1 else None,
                          cache_file_names=files, load_from_cache_file=False, desc=None)  # fmt: skip
        encoded = encoded.rename_column(LABEL_COLUMN, "labels")
        with atomic_directory(target, replace=overwrite) as tmp:
            encoded.save_to_disk(str(tmp))


def encoder(
    tokenizer: PreTrainedTokenizerBase, columns: list[str], max_seq_length: int, pad: bool
) -> Callable[[dict], dict]:
    """A batch of examples' tokenizer outputs (input_ids, ...), as the tokenized data holds them."""
    padding = "max_length" if pad else False

    def encode(batch: dict) -> dict:
        return tokenizer(*(batch[c] for c in columns), padding=padding, truncation=True, max_length=max_seq_length)

    return encode


def load_tokenized(path: Path) -> DatasetDict:
    return load_from_disk(str(path))


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
) -> DataLoader:
    """Rank r takes every world_size-th example of one seeded permutation, so the global batch of
    step k is the same contiguous slice of that permutation for every world size (see README).
    ``group_by_length`` reorders that permutation so that the global batch of an optimizer step
    (``batch_size`` x ``gradient_accumulation_steps`` x ``world_size``) holds examples of similar length."""
    if sampler is None and group_by_length:
        lengths = example_lengths(dataset)
        step_batch = batch_size * gradient_accumulation_steps
        sampler = LengthGroupedSampler(dataset, lengths, step_batch, num_replicas=world_size, rank=rank, seed=seed)
    if sampler is None:
        sampler = ResumableDistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collator(dataset, tokenizer),
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
    return DataLoader(
        shard, batch_size=batch_size, shuffle=False, collate_fn=collator(dataset, tokenizer), generator=own_generator(0)
    )


class MultiHotCollator:
    """Pads as DataCollatorWithPadding and turns each example's list of label ids into a float32 multi-hot
    row (BCE-with-logits' target). A class, not a closure: loader workers may pickle it."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, num_labels: int) -> None:
        self.pad, self.num_labels = DataCollatorWithPadding(tokenizer), num_labels

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        hot = torch.zeros(len(features), self.num_labels, dtype=torch.float32)
        for row, example in enumerate(features):
            hot[row, list(example["labels"])] = 1.0
        batch = self.pad([{k: v for k, v in example.items() if k != "labels"} for example in features])
        batch["labels"] = hot
        return batch


def collator(dataset: Dataset, tokenizer: PreTrainedTokenizerBase):
    """The collator of a tokenized split: multi-hot labels for a multi-label one; a regression's float
    labels stay float32 (DataCollatorWithPadding makes a float32 tensor of floats, int64 of ids)."""
    feature = dataset.features.get("labels")
    if isinstance(feature, List | LargeList):
        return MultiHotCollator(tokenizer, len(feature.feature.names))
    return DataCollatorWithPadding(tokenizer)


# A tokenizer's init settings that do not change its ids: where it was loaded from (its files' content is
# keyed instead), decoding and chat options, model_max_length (a run truncates at --max_seq_length), and the
# added tokens as loaded (the tokenizer's own, added since too, are keyed instead).
NOT_ENCODING = frozenset({
    "name_or_path", "is_local", "local_files_only", "_commit_hash", "cache_dir", "revision", "token",
    "trust_remote_code", "model_max_length", "clean_up_tokenization_spaces", "spaces_between_special_tokens",
    "chat_template", "processor_class", "auto_map", "device_map", "added_tokens_decoder",
})  # fmt: skip


def tokenizer_digest(tokenizer: PreTrainedTokenizerBase) -> str:
    """Identifies the ids a tokenizer gives (the tokenized data's cache key, a checkpoint's tokenizer check):
    its class, vocabulary, normalizer, pre-tokenizer, post-processor, added and special tokens, settings
    (do_lower_case, ...), truncation side and outputs; not where it was loaded from."""
    tokens = sorted((i, repr(token)) for i, token in tokenizer.added_tokens_decoder.items())
    # The form's name: a checkpoint that recorded another form (class and vocabulary alone, before issue 34)
    # resumes with a warning instead of a mismatch (checkpoint.Compatibility).
    return "tokenizer-v2:" + content_digest(
        type(tokenizer).__name__, sorted(tokenizer.get_vocab().items()), _backend_state(tokenizer), tokens,
        sorted(tokenizer.special_tokens_map.items()), _encoding_settings(tokenizer), tokenizer.truncation_side,
        list(tokenizer.model_input_names),
    )  # fmt: skip


def _backend_state(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """A Rust-backed tokenizer's tokenizer.json (normalizer, pre-tokenizer, model, post-processor, added tokens),
    less the truncation and padding that transformers sets at each call from the call's own arguments."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    state = json.loads(backend.to_str())
    state.pop("truncation", None)
    state.pop("padding", None)
    return json.dumps(state, sort_keys=True)


def _encoding_settings(tokenizer: PreTrainedTokenizerBase) -> list[tuple[str, str]]:
    """The tokenizer's init settings (do_lower_case, strip_accents, add_prefix_space, special tokens, ...)
    but its file paths and NOT_ENCODING."""
    files = set(getattr(tokenizer, "vocab_files_names", {}))
    return sorted(
        (name, repr(value))
        for name, value in tokenizer.init_kwargs.items()
        if name not in NOT_ENCODING and name not in files and not name.endswith(("_file", "_files"))
    )


def dataset_digest(dataset: Dataset) -> str:
    """A digest of a tokenized split's content (each column's values and list lengths), whatever the Arrow
    chunking of the files it was read from; one column at a time, without copying the split."""
    table = dataset.with_format("arrow")[0 : len(dataset)]  # the selected rows, in order
    h = hashlib.sha256()
    for name in sorted(table.column_names):
        column = table.column(name)
        h.update(f"{name}:{column.type}:{column.null_count};".encode())
        while pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            h.update(pc.list_value_length(column).fill_null(-1).to_numpy().tobytes())
            column = pc.list_flatten(column)
        if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
            h.update(column.fill_null(0).to_numpy().tobytes())
        else:  # not in tokenized data; exact but slow
            h.update(repr(column.to_pylist()).encode())
    return h.hexdigest()[:20]
