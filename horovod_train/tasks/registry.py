"""The task shapes, one row each. A new shape is a TaskShape subclass in its own module (tasks/single_label.py
is one) and its row here; the data, model, evaluation and outputs ask the run's shape, never its name."""

from __future__ import annotations

from typing import Any

from horovod_train.tasks.base import LabelColumn, LabelFlags, TaskShape
from horovod_train.tasks.multi_label import MultiLabel
from horovod_train.tasks.regression import Regression
from horovod_train.tasks.single_label import SingleLabel

# In the order they are asked which train data they claim: the first that claims it is the run's shape.
SHAPES: list[type[TaskShape]] = [MultiLabel, Regression, SingleLabel]


def claiming(train: LabelColumn, args: LabelFlags) -> type[TaskShape]:
    """The shape the train data's labels make (SingleLabel claims what no other shape does)."""
    return next(shape for shape in SHAPES if shape.claims(train, args))


def named_by(args: LabelFlags) -> type[TaskShape] | None:
    """The shape the flags alone choose, if any (--task_name stsb, --num_labels 1: a regression)."""
    return next((shape for shape in SHAPES if shape.named_by(args)), None)


def holding(feature: Any) -> type[TaskShape]:
    """The shape of encoded labels of ``feature`` (a tokenized split's ``labels``)."""
    found = next((shape for shape in SHAPES if shape.holds(feature)), None)
    if found is None:
        raise ValueError(f"no task shape holds labels of {feature}")
    return found


def named(name: str | None) -> type[TaskShape] | None:
    """The shape a run recorded (results' problem_type); None for a run that recorded none."""
    return next((shape for shape in SHAPES if shape.name == name), None)


def chance_accuracy(results: dict[str, Any]) -> float | None:
    """The recorded task shape's first metric by a uniform guess, which a score must beat (a single-label
    classification's accuracy); None where no one number says it (regression, multi-label, an older run)."""
    shape = named(results.get("problem_type"))
    if shape is None or not results.get("num_labels"):
        return None
    return shape(results["num_labels"]).chance
