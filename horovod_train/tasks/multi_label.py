"""Multi-label classification: a set of labels per example (BCE-with-logits on each label's logit, the labels
whose probability is over --multi_label_threshold predicted; subset accuracy and micro/macro F1)."""

from __future__ import annotations

from typing import Any

import torch
from datasets import ClassLabel, LargeList, List
from torch import nn
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from horovod_train.common.errors import UsageError
from horovod_train.tasks.base import LabelColumn, LabelFlags, LabelNames, TaskShape
from horovod_train.tasks.label_values import class_ids, is_string


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


class MultiLabel(TaskShape):
    name = problem_type = "multi_label_classification"

    @classmethod
    def claims(cls, train: LabelColumn, args: LabelFlags) -> bool:
        return cls.holds(train.feature)  # a list of labels per example (JSON lists; a CSV's read by the data)

    @classmethod
    def label_names(cls, train: LabelColumn, source: str, args: LabelFlags) -> LabelNames:
        """The ClassLabel's names; for names, the sorted distinct names (as run_classification.py); for
        integers, --num_labels or the largest id + 1."""
        inner = train.feature.feature
        cells = [cell for cell in train.values() if isinstance(cell, list)]
        values = {v for cell in cells for v in cell if v is not None}
        if not values:
            raise UsageError(
                f"train data column {source} holds lists of labels, all empty: no example has a label",
                'give each example the labels it has, e.g. ["sports", "politics"] ([] only for one that has none)',
            )
        if isinstance(inner, ClassLabel):
            return LabelNames(tuple(inner.names), f"the ClassLabel names of {source}", cls)
        if is_string(inner):
            return LabelNames(tuple(sorted(values)), "the train data's distinct labels", cls)
        ids = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        count = args.num_labels or (max(ids) + 1 if ids else 0)
        origin = f"--num_labels {count}" if args.num_labels else f"integer labels 0..{count - 1}"
        return LabelNames(tuple(f"LABEL_{i}" for i in range(count)), origin, cls)

    @classmethod
    def encode(cls, column: LabelColumn, where: str, labels: LabelNames, unlabelled_ok: bool) -> tuple[list, Any]:
        """A list of ClassLabel ids per example ([] for none); the collator makes it multi-hot."""
        inner = getattr(column.feature, "feature", None)
        lists = [_label_list(v, i, where, inner, unlabelled_ok) for i, v in enumerate(column.values())]
        textual = is_string(inner) or isinstance(inner, ClassLabel)  # a ClassLabel's ids came back as names
        ids = iter(class_ids([v for cell in lists for v in cell], textual, where, labels, unlabelled_ok=False))
        id_lists = [sorted({next(ids) for _ in cell}) for cell in lists]
        return id_lists, List(ClassLabel(names=list(labels.names)))

    @classmethod
    def holds(cls, feature: Any) -> bool:
        return isinstance(feature, List | LargeList)

    @classmethod
    def names_of(cls, feature: Any) -> list[str]:
        return list(feature.feature.names)

    @classmethod
    def collator(cls, tokenizer: PreTrainedTokenizerBase, feature: Any) -> MultiHotCollator:
        return MultiHotCollator(tokenizer, len(feature.feature.names))

    @property
    def outputs(self) -> int:
        return self.num_labels  # the multi-hot row

    def predictions(self, logits: torch.Tensor) -> torch.Tensor:
        return (torch.sigmoid(logits.float()) > self.threshold).long()

    def losses(self, logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        """BCE-with-logits averaged over the labels."""
        return nn.functional.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none").mean(-1)

    def predicted(self, rows: torch.Tensor) -> list:
        return [[i for i, hot in enumerate(row) if hot] for row in rows.tolist()]  # the predicted class ids

    def metric_names(self) -> tuple[str, ...]:
        return ("accuracy", "f1_micro", "f1_macro")  # accuracy: subset accuracy (every label right)

    @classmethod
    def shown(cls, prediction: Any, id2label: dict[int, str]) -> str:
        return str([id2label.get(label, label) for label in prediction])  # the list of label names
