"""One process, no wrapper: the baseline every other engine is measured against."""

from __future__ import annotations

import torch
from torch import nn

from horovod_train.engines.base import Engine
from horovod_train.launching import environment
from horovod_train.launching.base import ONE_PROCESS


def refuse_a_launcher(engine: str) -> None:
    """One-process engines under a multi-process launcher would train W copies into one --output_dir (the launcher
    table's check, which train makes before the engine starts)."""
    environment.check_joins(engine, {engine: ONE_PROCESS})  # no engine row: they import the engines


class SingleEngine(Engine):
    name = "single"

    def setup(self) -> None:
        refuse_a_launcher(self.name)
        if torch.cuda.is_available():
            self.device, self.device_rule = torch.device("cuda", 0), "first"
        self.set_cpu_threads()

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        return model.to(self.device), optimizer

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def broadcast_(self, tensor: torch.Tensor) -> None:
        pass  # the one process is rank 0

    def barrier(self) -> None:
        pass
