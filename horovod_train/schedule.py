"""The learning rate as a function of the training position.

Linear warmup, then linear decay to 0: the shape of transformers' ``get_linear_schedule_with_warmup``,
evaluated at the step the engine's policy reports. Resuming, an elastic rollback or a new world size
only move the position; there is no scheduler state to save or to patch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LinearSchedule:
    base_lr: float
    warmup_steps: int
    total_steps: int

    @classmethod
    def create(cls, base_lr: float, total_steps: int, warmup_steps: int = 0, warmup_ratio: float = 0.0):
        return cls(base_lr, warmup_steps or math.ceil(warmup_ratio * total_steps), total_steps)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return float(step) / float(max(1, self.warmup_steps))
        return max(0.0, float(self.total_steps - step) / float(max(1, self.total_steps - self.warmup_steps)))

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Set every parameter group's learning rate for ``step``; return it."""
        lr = self.base_lr * self.factor(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr
