"""Label values as the shapes read them: labels written as text (a number, a label name or a JSON list), and the
class ids of label names or integer labels."""

from __future__ import annotations

import json
import math
from collections import Counter

from horovod_train.common.errors import UsageError
from horovod_train.tasks.base import LabelNames

# What labels written as text hold (a CSV reads a column as text where one cell is not a number), for messages
LABEL_TEXT_KINDS = {"number": "numbers", "name": "label names", "list": "lists of labels"}
LABEL_TEXT_FIXES = {
    "number": "use either numbers or label names in a label column, not both (no label: an empty cell in test "
    "data; drop such examples from training data)",
    "name": "use either numbers or label names in a label column, not both",
    "list": 'write every label cell as a JSON list, e.g. ["sports", "politics"] ([] for none)',
}


def is_string(feature: object) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


def is_float(feature: object) -> bool:
    return getattr(feature, "dtype", None) in ("float16", "float32", "float64")


def label_text_kind(value: object) -> str | None:
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


def check_label_texts(values: list, where: str) -> set[str]:
    """Labels written as text are all numbers, all names or all lists; a mix ('0', '1', 'x'; '3.8', 'n/a') is
    a mistake: the first row of the rarer kind is named. Returns the kinds found."""
    kinds = [label_text_kind(v) for v in values]
    counts = Counter(kind for kind in kinds if kind is not None)
    if len(counts) > 1:
        (common, _), *_, (rare, _) = counts.most_common()
        row = kinds.index(rare)
        raise UsageError(
            f"{where} row {row + 1} holds {values[row]!r} where its other rows hold {LABEL_TEXT_KINDS[common]}",
            LABEL_TEXT_FIXES[common],
        )
    return set(counts)


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


def class_ids(values: list, textual: bool, where: str, labels: LabelNames, unlabelled_ok: bool) -> list[int]:
    """Each value's class id: a label name's (``textual``), or an integer label in 0..n-1."""
    if textual:
        check_label_texts(values, where)
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
