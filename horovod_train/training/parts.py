"""What setup() builds for a run: its plan, and the parts the loop trains with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from datasets import Dataset, DatasetDict
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from horovod_train.config.run_config import StepIntervals
from horovod_train.data.loaders import BatchWidths
from horovod_train.engines.policy import RunPolicy
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.training.position import TrainingPosition


@dataclass(frozen=True)
class RunPlan:
    """The run's length, planned from the steps per epoch of the world that set it up."""

    steps_per_epoch: int  # optimizer steps in one epoch
    num_epochs: int
    total_steps: int  # the learning-rate schedule's length
    global_batch: int  # examples per optimizer step over all ranks
    intervals: StepIntervals  # logging, evaluation and checkpoints, in steps of this run

    def epoch_float(self, position: TrainingPosition) -> float:
        return round(position.epoch + position.steps_in_epoch / max(self.steps_per_epoch, 1), 4)


@dataclass(frozen=True)
class RunParts:
    """Built once by setup(), in this order; what changes as the run goes is the loop's position."""

    tokenizer: Any  # a transformers PreTrainedTokenizerBase
    tokenized: DatasetDict
    compatibility: ckpt.Compatibility  # what a checkpoint must agree with
    model: nn.Module  # as the engine wrapped it
    optimizer: Optimizer  # as the engine wrapped it
    train_set: Dataset
    train_loader: DataLoader
    plan: RunPlan
    policy: RunPolicy
    checkpoints: ckpt.Checkpoints
    widths: BatchWidths | None = None  # the lengths batches are padded to, in training and evaluation
