"""Horovod: one process per device, hvd.DistributedOptimizer, broadcast from rank 0.

Gradients are all-reduced by Horovod's background thread as the backward pass produces them
(tensor fusion batches small tensors; NCCL ring all-reduce on GPUs, Gloo or MPI on CPUs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from horovod_train import amp, horovod_env
from horovod_train.engines.base import Engine
from horovod_train.errors import UsageError


class HorovodEngine(Engine):
    name = "horovod"

    def setup(self) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        self.horovod_env = horovod_env.apply(self.args, cuda=torch.cuda.is_available())  # read by hvd.init
        hvd.init()
        self.read_topology()
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)  # pin by local rank: global ranks exceed a node's GPUs
            self.device = torch.device("cuda", self.local_rank)
        self.set_cpu_threads()

    def read_topology(self) -> None:
        hvd = self.hvd
        self.rank, self.local_rank = hvd.rank(), hvd.local_rank()
        self.world_size, self.local_world_size = hvd.size(), hvd.local_size()

    # ---- elastic Horovod: the loop is re-entered from the last commit after workers leave or join ----
    def train_sampler(self, dataset: Any, seed: int) -> Any:
        return make_elastic_sampler(dataset, seed) if self.args.elastic else None

    def progress_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, sampler: Any, **fields: Any) -> Any:
        if not self.args.elastic:
            return super().progress_state(model, optimizer, sampler, **fields)
        # The optimizer is passed first so that its sync (broadcast_optimizer_state, which creates missing
        # state on joining workers with a dummy step that moves their parameters) runs before the
        # parameters are broadcast, and the joining workers end with rank 0's parameters exactly.
        state = self.hvd.elastic.TorchState(opt=optimizer, sampler=sampler, model=model, optimizer=None, **fields)
        state.register_reset_callbacks([self.read_topology])
        return state

    def run(self, loop: Any, state: Any) -> Any:
        return self.hvd.elastic.run(loop)(state) if self.args.elastic else loop(state)

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
        if not self.args.elastic:  # elastic: TorchState.sync broadcasts them when the loop (re)starts
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=compression,
            backward_passes_per_step=self.args.gradient_accumulation_steps,
            op=op,
            gradient_predivide_factor=self.args.gradient_predivide_factor,
            groups=horovod_env.optimizer_groups(self.args, cuda=self.device.type == "cuda"),
        )
        # No hvd.broadcast_optimizer_state: the wrapper starts with empty state on every rank, where
        # Horovod would create it with a dummy step (Adam's step count becomes 1, weight decay is applied
        # once). A resumed state is broadcast by the trainer and loaded on every rank alike.
        return model, optimizer

    def clip_and_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float, scaler: Any = None
    ) -> None:
        if self.device.type == "cpu":
            horovod_env.wait_politely(self.hvd, optimizer)
        if max_grad_norm <= 0 and scaler is None:
            optimizer.step()
            return
        # Unscale and clip the averaged gradient, not each rank's local one: wait for the all-reduce first.
        optimizer.synchronize()
        amp.unscale(optimizer, scaler)
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        with optimizer.skip_synchronize():
            amp.optimizer_step(optimizer, scaler)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.hvd.allreduce(tensor, op=self.hvd.Sum, name=None)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.hvd.allgather(tensor)

    def broadcast_object(self, obj: Any) -> Any:
        # An explicit name: Horovod defaults it to type(obj).__name__, which differs between the root
        # (the object) and the receivers (None), and the mismatched names hang the collective.
        return self.hvd.broadcast_object(obj, root_rank=0, name="horovod_train.broadcast_object")

    def local_main_first(self, work: Any) -> Any:
        # A worker that joins an elastic job runs this setup alone, so it must not wait in a collective
        # for the others: every rank does the work, cached and written atomically.
        return work() if self.args.elastic else super().local_main_first(work)

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
            "horovod_env": getattr(self, "horovod_env", {}),
        }

    def shutdown(self) -> None:
        self.hvd.shutdown()


def make_elastic_sampler(dataset: Any, seed: int) -> Any:
    """Horovod's ElasticSampler behind the trainer's sampler interface (begin_epoch/record_step). It
    shards one seeded permutation strided over the ranks like DistributedSampler, counts the samples
    processed in the epoch, and on a resize re-shards the rest of the epoch over the new world."""
    from horovod.torch.elastic import ElasticSampler

    class ElasticTrainSampler(ElasticSampler):
        def begin_epoch(self, epoch: int, skip_per_rank: int) -> None:
            if self.epoch != epoch:  # a re-entry inside an epoch keeps the committed position
                self.set_epoch(epoch)

        def record_step(self, samples_per_rank: int) -> None:
            self.record_batch(0, samples_per_rank)

    return ElasticTrainSampler(dataset, shuffle=True, seed=seed)
