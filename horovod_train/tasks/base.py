"""TaskShape: what a model predicts per example and how every part of a run treats it, asked instead of compared.

A shape is a class (its rules) and, for a run, an instance (its label count, GLUE task and threshold). The data
asks the class which train data it claims, its label names and how each split's labels are encoded, held and
collated; the model asks for transformers' ``problem_type`` (which picks the model's own training loss); the
evaluation asks an instance for its predictions, per-example losses and metrics; the outputs ask it how a
prediction is written. registry.py lists the shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from datasets import Dataset
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from horovod_train.tasks.scores import scores


class LabelFlags(Protocol):
    """The flags a shape reads (config.DataArguments': the task and the label count, when given)."""

    task_name: str | None
    num_labels: int | None


@dataclass(frozen=True)
class LabelColumn:
    """A split's label column, as a shape reads it (the data names the column)."""

    dataset: Dataset
    name: str

    @property
    def feature(self) -> Any:
        return self.dataset.features[self.name]

    def values(self) -> list:
        return list(self.dataset[self.name])

    def unique(self) -> list:
        return self.dataset.unique(self.name)


@dataclass(frozen=True)
class LabelNames:
    names: tuple[str, ...]
    origin: str  # where the names come from, for messages
    shape: type[TaskShape]


@dataclass(frozen=True)
class TaskShape:
    """A shape's rules (class attributes and class methods) and a run's values: the label count, the GLUE task
    (run_glue's metrics) or None (a custom dataset), and the threshold of a multi-label prediction."""

    name: ClassVar[str]  # the run's record (results' problem_type) and its task line
    problem_type: ClassVar[str]  # transformers' config.problem_type: the model's own loss in training
    min_labels: ClassVar[int] = 2  # fewer label names in the train data are refused
    smooths_labels: ClassVar[bool] = False  # --label_smoothing_factor applies
    row_dtype: ClassVar[torch.dtype] = torch.int64  # gathered (index, prediction, label) rows: exact in it

    num_labels: int = 2
    task_name: str | None = None
    threshold: float = 0.5

    # ---- the data: which train data makes this shape, its label names, each split's labels -----------------
    @classmethod
    def named_by(cls, args: LabelFlags) -> bool:
        """Whether the flags alone choose this shape (its labels are then read as it reads them, not as text)."""
        return False

    @classmethod
    def claims(cls, train: LabelColumn, args: LabelFlags) -> bool:
        """Whether the train data's labels make this shape (registry.SHAPES asks in its order)."""
        raise NotImplementedError

    @classmethod
    def label_names(cls, train: LabelColumn, source: str, args: LabelFlags) -> LabelNames:
        """The names of the labels (a model output each), and where they come from."""
        raise NotImplementedError

    @classmethod
    def encode(cls, column: LabelColumn, where: str, labels: LabelNames, unlabelled_ok: bool) -> tuple[list, Any]:
        """A split's labels as this shape holds them, and their feature; ``unlabelled_ok``: a test split,
        whose missing labels are kept (as a placeholder of the feature's type)."""
        raise NotImplementedError

    @classmethod
    def holds(cls, feature: Any) -> bool:
        """Whether encoded labels of this ``feature`` are this shape's (a tokenized split says its shape so)."""
        raise NotImplementedError

    @classmethod
    def names_of(cls, feature: Any) -> list[str]:
        """The label names of encoded labels."""
        raise NotImplementedError

    @classmethod
    def task_line(cls, names: list[str]) -> str:
        shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
        return f"task: {cls.name} over {len(names)} labels ({shown})"

    @classmethod
    def collator(cls, tokenizer: PreTrainedTokenizerBase, feature: Any) -> Any:
        """A batch of tokenized examples as the model takes it (DataCollatorWithPadding: a float32 tensor of
        floats, int64 of ids). A class, not a closure: loader workers may pickle it."""
        return DataCollatorWithPadding(tokenizer)

    # ---- the model's outputs: predictions, losses, metrics, written predictions ---------------------------
    @property
    def outputs(self) -> int:
        """Values per example in a prediction (and in a label)."""
        return 1

    def predictions(self, logits: torch.Tensor) -> torch.Tensor:
        """One row of ``outputs`` values per example."""
        raise NotImplementedError

    def losses(self, logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        """Each example's loss, as the model's own (its mean is the model's loss of the batch)."""
        raise NotImplementedError

    def predicted(self, rows: torch.Tensor) -> list:
        """The prediction of each example from its gathered prediction row, as its output is written."""
        return rows[:, 0].tolist()

    def metric_names(self) -> tuple[str, ...]:
        """The evaluation metrics besides ``loss``, the first the primary one (its per-rank values are logged)."""
        raise NotImplementedError

    def score(self, predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
        """``metric_names()`` of predictions against references (in example order)."""
        return scores(self.metric_names(), predictions, references)

    @classmethod
    def shown(cls, prediction: Any, id2label: dict[int, str]) -> str:
        """A prediction's cell in predict_results.txt (run_glue's and run_classification's format)."""
        return str(prediction)

    @property
    def chance(self) -> float | None:
        """The first metric's value for a uniform guess, which a score must beat; None where no one number says it."""
        return None
