"""Horovod: one process per device, hvd.DistributedOptimizer, broadcast from rank 0.

Gradients are all-reduced by Horovod's background thread as the backward pass produces them
(tensor fusion batches small tensors; NCCL ring all-reduce on GPUs, Gloo or MPI on CPUs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from horovod_train.engines.base import Engine
from horovod_train.errors import UsageError


class HorovodEngine(Engine):
    name = "horovod"

    def setup(self) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        hvd.init()
        self.rank, self.local_rank = hvd.rank(), hvd.local_rank()
        self.world_size, self.local_world_size = hvd.size(), hvd.local_size()
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)  # pin by local rank: global ranks exceed a node's GPUs
            self.device = torch.device("cuda", self.local_rank)
        self.set_cpu_threads()

    def effective_learning_rate(self, learning_rate: float) -> float:
        if not self.args.scale_lr:
            return learning_rate
        if self.args.op == "adasum":
            # Horovod's guidance: Adasum needs no scaling by size, only by the ranks that are summed
            # locally first (NCCL hierarchical reduction) when running on GPUs.
            return learning_rate * (self.local_world_size if self.hvd.nccl_built() else 1)
        return learning_rate * self.world_size

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        hvd = self.hvd
        model.to(self.device)
        compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[self.args.compression]
        op = {"average": hvd.Average, "adasum": hvd.Adasum}[self.args.op]
        if op == hvd.Adasum and self.world_size & (self.world_size - 1):
            raise UsageError(
                f"--op adasum needs a power-of-two world size (got {self.world_size})",
                "launch 1, 2, 4, 8, ... ranks or use --op average",
            )
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=compression,
            backward_passes_per_step=self.args.gradient_accumulation_steps,
            op=op,
            gradient_predivide_factor=self.args.gradient_predivide_factor,
        )
        # No hvd.broadcast_optimizer_state: the wrapper starts with empty state on every rank, where
        # Horovod would create it with a dummy step (Adam's step count becomes 1, weight decay is applied
        # once). A resumed state is broadcast by the trainer and loaded on every rank alike.
        return model, optimizer

    def clip_and_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> None:
        if max_grad_norm <= 0:
            optimizer.step()
            return
        # Clip the averaged gradient, not each rank's local one: wait for the all-reduce first.
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        with optimizer.skip_synchronize():
            optimizer.step()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.hvd.allreduce(tensor, op=self.hvd.Sum, name=None)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.hvd.allgather(tensor)

    def broadcast_object(self, obj: Any) -> Any:
        # An explicit name: Horovod defaults it to type(obj).__name__, which differs between the root
        # (the object) and the receivers (None), and the mismatched names hang the collective.
        return self.hvd.broadcast_object(obj, root_rank=0, name="horovod_train.broadcast_object")

    def barrier(self) -> None:
        self.hvd.barrier()

    def describe(self) -> dict[str, Any]:
        hvd = self.hvd
        controller = "mpi" if hvd.mpi_enabled() else "gloo"
        return {
            **super().describe(),
            "controller": controller,
            "nccl_built": bool(hvd.nccl_built()),
            "compression": self.args.compression,
            "op": self.args.op,
        }

    def shutdown(self) -> None:
        self.hvd.shutdown()
