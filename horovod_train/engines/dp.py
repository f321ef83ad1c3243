"""torch.nn.DataParallel: one process, the batch split over the visible GPUs, replicas made each step.

The loss is computed inside each replica's forward, so only per-replica scalars (loss, example count)
are gathered on GPU 0 rather than every replica's logits. Without GPUs it runs one replica on the CPU.

Each replica runs in its own thread (``parallel_apply``), and autocast's dtype is per thread: the replica
opens autocast with the run's dtype itself (``--bf16`` would otherwise run the replicas in float16, with
no loss scaler). ``--torch_compile`` is refused: ``model.compile()`` compiles in place, and the replicas
DataParallel makes each step would call the compiled forward bound to the original module on GPU 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from horovod_train.common.console import write_line
from horovod_train.common.errors import UsageError
from horovod_train.engines.single import SingleEngine, refuse_a_launcher
from horovod_train.tasks.single_label import training_loss
from horovod_train.training import amp

if TYPE_CHECKING:  # the engine rows, which config reads, import the engines
    from horovod_train.config.run_config import RunConfig


class LossPerReplica(nn.Module):
    """Returns (loss, example count) as 1-element tensors, which DataParallel concatenates over replicas."""

    def __init__(self, model: nn.Module, autocast_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.model = model
        self.autocast_dtype = autocast_dtype

    def forward(self, label_smoothing: float = 0.0, **batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with amp.autocast_to(batch["labels"].device.type, self.autocast_dtype):  # this replica's thread
            loss = training_loss(self.model, batch, label_smoothing)
        count = torch.tensor([batch["labels"].shape[0]], dtype=loss.dtype, device=loss.device)
        return loss.reshape(1), count


class DataParallelEngine(SingleEngine):
    """Collectives are those of the single-process baseline: there is one process."""

    name = "dp"
    device_ids: list[int] = []

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        if self.training.torch_compile:
            raise UsageError(
                "--engine dp cannot use --torch_compile: DataParallel's replicas would run the compiled forward "
                "of the module on GPU 0 (its weights, its device)",
                "drop --torch_compile, or use --engine ddp or horovod (one process per GPU)",
            )
        self.autocast_dtype = amp.DTYPES[amp.precision_of(self.training.bf16, self.training.fp16)]

    def setup(self) -> None:
        refuse_a_launcher(self.name)
        self.device_ids = list(range(torch.cuda.device_count()))
        if self.device_ids:
            self.device, self.device_rule = torch.device("cuda", self.device_ids[0]), "first"
        else:
            write_line("dp: no GPU visible, running DataParallel on the CPU with one replica")
        self.set_cpu_threads()

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        model.to(self.device)
        replica = LossPerReplica(model, self.autocast_dtype)
        return nn.DataParallel(replica, device_ids=self.device_ids or None), optimizer

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module.model if isinstance(model, nn.DataParallel) else model

    def forward_loss(
        self, model: nn.Module, batch: dict[str, torch.Tensor], label_smoothing: float = 0.0
    ) -> torch.Tensor:
        losses, counts = model(**batch, label_smoothing=label_smoothing)
        # Each replica's loss is a mean over its share; weight by share so unequal splits average exactly.
        return (losses * (counts / counts.sum())).sum()

    def describe(self) -> dict[str, Any]:
        described = {**super().describe(), "replicas": max(1, len(self.device_ids))}
        if self.device_ids:  # peak_memory_mb_per_rank is GPU 0's: every replica's GPU fills up
            described["peak_memory_mb_per_gpu"] = [
                round(torch.cuda.max_memory_allocated(i) / 2**20, 1) for i in self.device_ids
            ]
        return described
