"""A run's labels: the task's shape (single-label, multi-label or regression) and its label names, resolved
from the train data as run_classification.py does unless flags say; each split's labels encoded in that
shape; labels written as text checked to hold one kind of label."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, LargeList, List, Value

from horovod_train import glue, synthetic
from horovod_train.config import DataArguments
from horovod_train.data.columns import LABEL_COLUMN
from horovod_train.errors import UsageError
from horovod_train.metrics import MULTI_LABEL, REGRESSION, SINGLE_LABEL

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


def labels_as_written(dataset: Dataset, where: str, args: DataArguments) -> Dataset:
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
