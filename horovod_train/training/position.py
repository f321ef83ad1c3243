"""Where a run stands: one record that the loop advances, checkpoints save and elastic Horovod commits."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainingPosition:
    global_step: int = 0
    epoch: int = 0
    steps_in_epoch: int = 0  # optimizer steps taken inside `epoch`
    samples_in_epoch: int = 0  # examples (all ranks together) consumed inside `epoch`, a partial last batch as it was
    total_steps: int = 0  # the learning-rate schedule's length
    history: list[dict[str, Any]] = field(default_factory=list)  # the evaluation at each epoch end
    log_history: list[dict[str, Any]] = field(default_factory=list)  # transformers' log_history: logs, evals
    world_sizes: list[list[int]] = field(default_factory=list)  # [global step, world size] at each change
    epoch_examples: list[int] = field(default_factory=list)  # --audit_samples: example indices seen this epoch
    best_metric: float | None = None  # --metric_for_best_model's best value at a checkpoint (transformers' names)
    best_model_checkpoint: str | None = None

    def epochs_done(self, train_examples: int) -> float:
        """Epochs completed, counting the current one by the share of its examples consumed."""
        return self.epoch + min(1.0, self.samples_in_epoch / train_examples)

    def record_world_size(self, world_size: int) -> None:
        if not self.world_sizes or self.world_sizes[-1][1] != world_size:
            self.world_sizes.append([self.global_step, world_size])

    def advance(self, samples: int) -> None:
        """One optimizer step that consumed ``samples`` examples over all ranks: those its batches held, so
        that a step ending an epoch in a partial batch leaves the position at the epoch's end, not past it."""
        self.global_step += 1
        self.steps_in_epoch += 1
        self.samples_in_epoch += samples

    def next_epoch(self) -> None:
        self.epoch += 1
        self.steps_in_epoch = self.samples_in_epoch = 0
        self.epoch_examples = []

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> TrainingPosition:
        """The position fields of a saved record (a checkpoint's trainer state holds more)."""
        return cls(**{f.name: saved[f.name] for f in dataclasses.fields(cls) if f.name in saved})
