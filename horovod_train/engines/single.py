"""One process, no wrapper: the baseline every other engine is measured against."""

from __future__ import annotations

import torch
from torch import nn

from horovod_train.engines.base import Engine


class SingleEngine(Engine):
    name = "single"

    def setup(self) -> None:
        if torch.cuda.is_available():
            self.device = torch.device("cuda", 0)
        self.set_cpu_threads()

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        return model.to(self.device), optimizer

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def barrier(self) -> None:
        pass
