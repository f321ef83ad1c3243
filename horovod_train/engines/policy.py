"""What the training loop asks its engine about the run's course, for a run of fixed world size.

An engine whose world can change (elastic Horovod) supplies a subclass: it ends the run by epochs,
places the learning rate by the data seen, commits its state after steps, and re-enters the loop
after a resize (engines/horovod/elastic.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from horovod_train.training.position import TrainingPosition

T = TypeVar("T")


class RunPolicy:
    def run(self, loop: Callable[[TrainingPosition], T], position: TrainingPosition) -> T:
        """Run the loop from ``position``; it returns the last evaluation."""
        return loop(position)

    def finished(self, position: TrainingPosition) -> bool:
        return position.global_step >= position.total_steps

    def schedule_step(self, position: TrainingPosition) -> int:
        """Where the learning-rate schedule stands."""
        return position.global_step

    def after_step(self, position: TrainingPosition) -> None:
        """Called after each optimizer step."""

    def after_epoch(self, position: TrainingPosition) -> None:
        """Called after each end-of-epoch evaluation and checkpoint."""
