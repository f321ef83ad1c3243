"""Single-label classification: one class per example (cross-entropy over the classes, argmax predictions)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from datasets import ClassLabel
from torch import nn

from horovod_train.common.errors import UsageError
from horovod_train.data import glue, synthetic
from horovod_train.tasks.base import LabelColumn, LabelFlags, LabelNames, TaskShape
from horovod_train.tasks.label_values import class_ids, is_string
from horovod_train.tasks.scores import custom_classification_scores


def _nli_names(labels: set[str]) -> bool:
    """multi_nli's names: all the labels are among them, or (a '-' or typo aside) two or more of them are."""
    known = set(synthetic.LABEL_NAMES)
    return labels <= known or len(labels & known) >= 2


class SingleLabel(TaskShape):
    name = problem_type = "single_label_classification"
    smooths_labels = True

    @classmethod
    def claims(cls, train: LabelColumn, args: LabelFlags) -> bool:
        return True  # what no other shape claims

    @classmethod
    def label_names(cls, train: LabelColumn, source: str, args: LabelFlags) -> LabelNames:
        """A ClassLabel's names; the task's; for string labels multi_nli's or the sorted distinct labels (as
        run_classification.py); for integer labels --num_labels or their distinct count (multi_nli's names for 3)."""
        feature = train.feature
        if isinstance(feature, ClassLabel):
            return LabelNames(tuple(feature.names), f"the ClassLabel names of {source}", cls)
        if args.task_name in glue.TASK_LABEL_NAMES:
            return LabelNames(glue.TASK_LABEL_NAMES[args.task_name], f"--task_name {args.task_name}'s names", cls)
        if is_string(feature):
            values = {v for v in train.unique() if v is not None}
            nli = _nli_names(values)
            names = synthetic.LABEL_NAMES if nli else tuple(sorted(values))
            return LabelNames(names, "the multi_nli names" if nli else "the train data's distinct labels", cls)
        count = args.num_labels or len(train.unique())
        names = synthetic.LABEL_NAMES if count == 3 else tuple(f"LABEL_{i}" for i in range(count))
        origin = f"--num_labels {count}" if args.num_labels else f"{count} distinct integer labels"
        return LabelNames(names, origin, cls)

    @classmethod
    def encode(cls, column: LabelColumn, where: str, labels: LabelNames, unlabelled_ok: bool) -> tuple[list, Any]:
        """A ClassLabel id per example (-1, no label, only where ``unlabelled_ok``)."""
        feature = column.feature
        values, textual = column.values(), is_string(feature)
        if isinstance(feature, ClassLabel) and sorted(feature.names) == sorted(labels.names):
            # the run's names in another order (the pretrained model's: labels.in_model_order): each id by its name
            values, textual = [None if v is None or v < 0 else feature.int2str(v) for v in values], True
        elif isinstance(feature, ClassLabel) and tuple(feature.names) != labels.names:
            raise UsageError(
                f"{where} has label names ({', '.join(feature.names)}) other than the train data's "
                f"({', '.join(labels.names)})",
                "give every split the same ClassLabel names",
            )
        ids = class_ids(values, textual, where, labels, unlabelled_ok)
        return ids, ClassLabel(names=list(labels.names))

    @classmethod
    def holds(cls, feature: Any) -> bool:
        return isinstance(feature, ClassLabel)

    @classmethod
    def names_of(cls, feature: Any) -> list[str]:
        return list(feature.names)

    def predictions(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1, keepdim=True)

    def losses(self, logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        return smoothed_cross_entropy(logits, labels, label_smoothing)

    def metric_names(self) -> tuple[str, ...]:
        if self.task_name is not None and self.task_name not in glue.REGRESSION_TASKS:
            return glue.task_metric_names(self.task_name)
        return ("accuracy", "f1")

    def score(self, predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
        """A custom dataset's F1 is macro-averaged over the classes (evaluate's modules, as before)."""
        if self.task_name is None:
            return custom_classification_scores(predictions.tolist(), references.tolist())
        return super().score(predictions, references)

    @classmethod
    def shown(cls, prediction: Any, id2label: dict[int, str]) -> str:
        return str(id2label.get(prediction, prediction))  # the label name

    @property
    def chance(self) -> float | None:
        return 1 / self.num_labels


def smoothed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Each example's cross-entropy, with ``label_smoothing`` as transformers' LabelSmoother computes it ((1 - eps) *
    NLL + eps * the mean over classes of -log p: torch's ``label_smoothing``), in float32: the one formula training
    (``training_loss``) and evaluation (``SingleLabel.losses``) share."""
    return nn.functional.cross_entropy(logits.float(), labels, reduction="none", label_smoothing=label_smoothing)


def training_loss(model: nn.Module, batch: dict[str, torch.Tensor], label_smoothing: float) -> torch.Tensor:
    """The loss a training step backpropagates (every engine's forward pass calls it): the model's own, which its
    ``problem_type`` picks, or with --label_smoothing_factor (single-label classification's alone: training.build
    refuses it for another shape) the batch mean of ``smoothed_cross_entropy``."""
    if not label_smoothing:
        return model(**batch).loss
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    return smoothed_cross_entropy(logits.view(-1, logits.size(-1)), batch["labels"].view(-1), label_smoothing).mean()
