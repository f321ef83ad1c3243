"""The learning rate as a function of the training position.

transformers' schedules (``--lr_scheduler_type``: linear, cosine, constant, constant_with_warmup), the
same shapes as ``transformers.get_scheduler`` gives, evaluated at the step the engine's policy reports.
Resuming, an elastic rollback or a new world size only move the position; there is no scheduler state
to save or to patch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch  # the argument checks (domains.py) read SCHEDULES: no torch on that path

SCHEDULES = ("linear", "cosine", "constant", "constant_with_warmup")


@dataclass(frozen=True)
class Schedule:
    base_lr: float
    warmup_steps: int
    total_steps: int
    kind: str = "linear"

    @classmethod
    def create(
        cls, base_lr: float, total_steps: int, warmup_steps: int = 0, warmup_ratio: float = 0.0, kind: str = "linear"
    ) -> Schedule:
        warmup = 0 if kind == "constant" else warmup_steps or math.ceil(warmup_ratio * total_steps)
        return cls(base_lr, warmup, total_steps, kind)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return float(step) / float(max(1, self.warmup_steps))
        if self.kind in ("constant", "constant_with_warmup"):
            return 1.0
        if self.kind == "cosine":  # half a cosine period, as num_cycles=0.5
            progress = float(step - self.warmup_steps) / float(max(1, self.total_steps - self.warmup_steps))
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 2.0 * 0.5 * progress)))
        return max(0.0, float(self.total_steps - step) / float(max(1, self.total_steps - self.warmup_steps)))

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Set every parameter group's learning rate for ``step``; return it."""
        lr = self.base_lr * self.factor(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr
