"""A run's labels: the task's shape and its label names, from the train data's labels (the first shape in
tasks/registry.py that claims them, as run_classification.py infers its task unless flags say), each split's
labels encoded as that shape holds them; labels written as text checked to hold one kind of label."""

from __future__ import annotations

import json
from collections.abc import Sequence

from datasets import ClassLabel, Dataset, DatasetDict, List, Value

from horovod_train.common.errors import UsageError
from horovod_train.config.run_config import DataArguments
from horovod_train.data.columns import LABEL_COLUMN
from horovod_train.tasks import registry
from horovod_train.tasks.base import LabelColumn, LabelNames, TaskShape
from horovod_train.tasks.label_values import check_label_texts, is_string


def labels_as_written(dataset: Dataset, where: str, args: DataArguments) -> Dataset:
    """A label column of text checked to hold one kind of label (check_label_texts), its JSON lists read as
    lists (multi-label, as a JSON file's lists). A shape the flags name (a regression) reads each label itself."""
    if not is_string(dataset.features[LABEL_COLUMN]) or registry.named_by(args) is not None:
        return dataset
    values = list(dataset[LABEL_COLUMN])
    if "list" not in check_label_texts(values, where):
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


def resolve_label_names(
    train: Dataset, source: str, args: DataArguments, model_labels: tuple[str, ...] | None = None
) -> LabelNames:
    """The task's shape (the first that claims the train data's labels) and its label names, in the order of
    ``model_labels`` (the pretrained model's own, in_model_order) where they are the same names."""
    column = LabelColumn(train, LABEL_COLUMN)
    found = in_model_order(registry.claiming(column, args).label_names(column, source, args), column, model_labels)
    if args.num_labels is not None and args.num_labels != len(found.names):
        raise UsageError(
            f"--num_labels {args.num_labels} but the train data has {len(found.names)} labels "
            f"({', '.join(found.names[:10])}: {found.origin})",
            "drop --num_labels (it is inferred from the data)",
        )
    if len(found.names) < found.shape.min_labels and len(train) == 1:
        raise UsageError("train data has a single example", "add examples, of two or more labels")
    if len(found.names) < found.shape.min_labels:
        raise UsageError(
            f"train data column {source} has a single label ({', '.join(map(str, found.names))})",
            "a classifier needs examples of two or more labels (check --label_column_name; --num_labels 1 "
            "for a regression)",
        )
    return found


def in_model_order(found: LabelNames, column: LabelColumn, model_labels: tuple[str, ...] | None) -> LabelNames:
    """The data's label names in the order of the names a pretrained classifier was trained with (its config's
    id2label), where they are the same names, case aside, as run_glue.py compares them: its head's rows keep their
    meaning and its ids stay its labels'. Sorted, a file's ``positive``/``negative`` had relabelled the rows of a
    model trained with ``positive`` first, and roberta-large-mnli's CONTRADICTION row became entailment. Names
    only: integer labels are ids already."""
    inner = getattr(column.feature, "feature", column.feature)  # a multi-label list's labels
    if not model_labels or not (isinstance(inner, ClassLabel) or is_string(inner)):
        return found
    by_lower = {name.lower(): name for name in found.names}
    if len(by_lower) != len(found.names) or not same_names(found.names, model_labels):
        return found
    names = tuple(by_lower[name.lower()] for name in model_labels)
    return found if names == found.names else LabelNames(names, f"{found.origin}, in the model's order", found.shape)


def same_names(names: Sequence[str], others: Sequence[str]) -> bool:
    """The same label names, in any order and case aside (run_glue.py's comparison of a model's labels with the
    data's)."""
    return sorted(name.lower() for name in names) == sorted(name.lower() for name in others)


def encode_labels(dataset: Dataset, where: str, labels: LabelNames, unlabelled_ok: bool) -> Dataset:
    """The label column as ``labels``'s shape holds it (``unlabelled_ok``: test splits, whose labels may be
    missing)."""
    values, feature = labels.shape.encode(LabelColumn(dataset, LABEL_COLUMN), where, labels, unlabelled_ok)
    return _replace_labels(dataset, values, feature)


def _replace_labels(dataset: Dataset, values: list, feature: object) -> Dataset:
    return dataset.remove_columns(LABEL_COLUMN).add_column(LABEL_COLUMN, values, feature=feature)


def _label_feature(ds: DatasetDict) -> object:
    features = ds["train"].features
    return features["labels" if "labels" in features else LABEL_COLUMN]


def shape_of(ds: DatasetDict) -> type[TaskShape]:
    """The task shape of a load_raw_datasets (``label``) or tokenized (``labels``) result, from its labels."""
    return registry.holding(_label_feature(ds))


def label_names(ds: DatasetDict) -> list[str]:
    """The label names of a load_raw_datasets or tokenized result (a model output each: a regression's one
    output is LABEL_0, as transformers names it)."""
    feature = _label_feature(ds)
    return registry.holding(feature).names_of(feature)


def task_line(ds: DatasetDict) -> str:
    """What the labels made of the run (inferred from their values unless flags say), for rank 0's log."""
    return shape_of(ds).task_line(label_names(ds))
