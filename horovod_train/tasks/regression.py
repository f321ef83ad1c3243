"""Regression: one number per example (MSE on one output; the output is the prediction), as run_glue's STS-B."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from datasets import Value

from horovod_train.common.errors import UsageError
from horovod_train.data import glue
from horovod_train.tasks.base import LabelColumn, LabelFlags, LabelNames, TaskShape
from horovod_train.tasks.label_values import is_float, is_string, label_text_kind

NAMES = ("LABEL_0",)  # transformers' id2label for num_labels=1


def _value(value: object, row: int, where: str, labels: LabelNames, unlabelled_ok: bool) -> float:
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


class Regression(TaskShape):
    name = problem_type = "regression"
    min_labels = 1
    row_dtype = torch.float64  # exact for a float32 output and any index below 2**53

    @classmethod
    def named_by(cls, args: LabelFlags) -> bool:
        return args.task_name in glue.REGRESSION_TASKS or args.num_labels == 1

    @classmethod
    def claims(cls, train: LabelColumn, args: LabelFlags) -> bool:
        """--task_name stsb, --num_labels 1, or numeric labels of which one is not a whole number: floats, or
        numbers written as text (JSON strings such as "3.8")."""
        if cls.named_by(args):
            return True
        values = [v for v in train.unique() if v is not None]
        if is_string(train.feature) and all(label_text_kind(v) == "number" for v in values):
            values = [float(v) for v in values]
        elif not is_float(train.feature):
            return False
        return any(math.isfinite(v) and not v.is_integer() for v in values)

    @classmethod
    def label_names(cls, train: LabelColumn, source: str, args: LabelFlags) -> LabelNames:
        origin = f"--task_name {args.task_name}" if args.task_name in glue.REGRESSION_TASKS else "float labels"
        return LabelNames(NAMES, "--num_labels 1" if args.num_labels == 1 else origin, cls)

    @classmethod
    def encode(cls, column: LabelColumn, where: str, labels: LabelNames, unlabelled_ok: bool) -> tuple[list, Any]:
        """A float32 per example (NaN for no label)."""
        floats = [_value(v, i, where, labels, unlabelled_ok) for i, v in enumerate(column.values())]
        return floats, Value("float32")

    @classmethod
    def holds(cls, feature: Any) -> bool:
        return isinstance(feature, Value)  # one number per example

    @classmethod
    def names_of(cls, feature: Any) -> list[str]:
        return list(NAMES)

    @classmethod
    def task_line(cls, names: list[str]) -> str:
        return "task: regression (one number per example)"

    def predictions(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().double()[:, :1]

    def losses(self, logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        return (logits.float().squeeze(-1) - labels.float()) ** 2  # MSE's, per example

    def metric_names(self) -> tuple[str, ...]:
        if self.task_name in glue.REGRESSION_TASKS:
            return glue.task_metric_names(self.task_name)
        return ("mse", "pearson", "spearmanr")

    @classmethod
    def shown(cls, prediction: Any, id2label: dict[int, str]) -> str:
        return f"{prediction:3.3f}"  # run_glue's {:3.3f}
