"""Horovod: one process per device, hvd.DistributedOptimizer, broadcast from rank 0.

Gradients are all-reduced by Horovod's background thread as the backward pass produces them
(tensor fusion batches small tensors; NCCL ring all-reduce on GPUs, Gloo or MPI on CPUs).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer

from horovod_train.common.console import write_line
from horovod_train.common.errors import UsageError
from horovod_train.engines.base import Engine, clip_gradient
from horovod_train.engines.horovod import elastic, env
from horovod_train.engines.horovod.options import HorovodArguments
from horovod_train.engines.policy import RunPolicy
from horovod_train.launching import environment
from horovod_train.launching.mpirun import Mpirun, check_mpi_world
from horovod_train.training import amp, phases

if TYPE_CHECKING:  # config/parsing.py reads the engine rows, which import the engines
    from horovod_train.config.run_config import RunConfig


class HorovodEngine(Engine):
    name = "horovod"

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.options = config.options(HorovodArguments)
        env.check_groups(self.options)

    def setup(self) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        cuda = torch.cuda.is_available()
        self.horovod_env = env.apply(self.options, cuda, self.training.ddp_timeout)  # read by hvd.init
        hvd.init()
        self.read_topology()
        if Mpirun.variables.world_size in os.environ:  # mpirun's, or left over: Horovod's MPI then starts a world of 1
            check_mpi_world(os.environ, self.world_size)
        warning = env.nccl_warning(hvd, cuda)
        if warning and self.is_main:
            write_line(warning, sys.stderr)
        if torch.cuda.is_available():  # by local rank (global ranks exceed a node's GPUs), or a task's only GPU
            self.device, self.device_rule = environment.pin_cuda_device(self.local_rank)
        self.set_cpu_threads()

    def read_topology(self) -> None:
        hvd = self.hvd
        self.rank, self.local_rank = hvd.rank(), hvd.local_rank()
        self.world_size, self.local_world_size = hvd.size(), hvd.local_size()

    def train_sampler(self, dataset: Any, seed: int) -> Any:
        return elastic.make_elastic_sampler(dataset, seed) if self.options.elastic else None

    def policy(
        self, model: nn.Module, optimizer: Optimizer, sampler: Any, train_examples: int, scaler: Any = None
    ) -> RunPolicy:
        if not self.options.elastic:
            return super().policy(model, optimizer, sampler, train_examples)
        return elastic.ElasticPolicy(
            self.hvd,
            model,
            optimizer,
            sampler,
            train_examples=train_examples,
            num_train_epochs=self.training.num_train_epochs,
            by_epochs=self.training.max_steps <= 0,
            commit_steps=self.options.elastic_commit_steps,
            on_reset=self.read_topology,
            scaler=scaler,
        )

    def step_examples(self, per_rank: int) -> int | None:
        return None if self.options.elastic else super().step_examples(per_rank)

    def joins_running_job(self, recorded: dict[str, Any]) -> bool:
        return self.options.elastic and elastic.joins_running_job(recorded)

    @property
    def collective_setup(self) -> bool:
        return not self.options.elastic

    def effective_learning_rate(self, learning_rate: float) -> float:
        if not self.options.scale_lr:
            return learning_rate
        if self.options.op == "adasum":
            # Horovod's guidance: Adasum needs no scaling by size, only by the ranks that are summed
            # locally first (NCCL hierarchical reduction) when running on GPUs.
            return learning_rate * (self.local_world_size if self.hvd.nccl_built() else 1)
        return learning_rate * self.world_size

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        hvd, options = self.hvd, self.options
        model.to(self.device)
        compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[options.compression]
        op = {"average": hvd.Average, "adasum": hvd.Adasum}[options.op]
        if op == hvd.Adasum:
            self.check_adasum()
        if not options.elastic:  # elastic: TorchState.sync broadcasts them when the loop (re)starts
            hvd.broadcast_parameters(rank_dependent_state(model), root_rank=0)
        # Trained parameters only: with LoRA the frozen weights have no gradient to all-reduce.
        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = env.optimizer_groups(options, self.device.type == "cuda", [p for _, p in trained])
        self.gradient_groups = groups if groups is None or isinstance(groups, int) else len(groups)
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=trained,
            compression=compression,
            backward_passes_per_step=self.training.gradient_accumulation_steps,
            op=op,
            gradient_predivide_factor=options.gradient_predivide_factor,
            groups=groups,
        )
        # No hvd.broadcast_optimizer_state: the wrapper starts with empty state on every rank, where
        # Horovod would create it with a dummy step (Adam's step count becomes 1, weight decay is applied
        # once). A resumed state is broadcast by the trainer and loaded on every rank alike.
        return model, optimizer

    def check_adasum(self) -> None:
        if self.world_size & (self.world_size - 1):
            raise UsageError(
                f"--op adasum needs a power-of-two world size (got {self.world_size})",
                "launch 1, 2, 4, 8, ... ranks or use --op average",
            )
        if not self.hvd.mpi_enabled():  # Horovod implements Adasum over MPI only (Gloo has none)
            raise UsageError(
                "--op adasum needs Horovod's MPI controller, not Gloo",
                "launch with mpirun or horovodrun --mpi, or use --op average",
            )

    def clip_and_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float, scaler: Any = None
    ) -> torch.Tensor | None:
        plain = max_grad_norm <= 0 and scaler is None
        with phases.span(phases.GRADIENT_WAIT):
            if self.device.type == "cpu":
                env.wait_politely(self.hvd, optimizer)
            if not plain:
                # Unscale and clip the averaged gradient, not each rank's local one: wait for the all-reduce first.
                optimizer.synchronize()
        if plain:
            optimizer.step()  # waits for the all-reduce, which leaves the averaged gradient: its norm
            return clip_gradient(model.parameters(), max_grad_norm)
        amp.unscale(optimizer, scaler)
        norm = clip_gradient(model.parameters(), max_grad_norm)
        with optimizer.skip_synchronize():
            amp.optimizer_step(optimizer, scaler)
        return norm

    def wait(self, handle: int) -> Any:
        """The result of the engine's own collectives (not the gradients'), which wait for seconds where rank 0
        writes a checkpoint or builds the tokenizer: polled without spinning (env.poll_until_done), up to 5 ms
        apart, then taken from Horovod (complete: synchronize returns at once, or raises what it raised)."""
        env.poll_until_done(self.hvd, handle, longest_sleep_s=5e-3)
        return self.hvd.synchronize(handle)

    def all_reduce_sum(self, tensor: torch.Tensor, name: str = "horovod_train.all_reduce_sum") -> torch.Tensor:
        # Named as broadcast_ below; its own name, as it may run while all_reduce_sum_async's is in flight.
        return self.wait(self.hvd.allreduce_async(tensor, op=self.hvd.Sum, name=name))

    def all_reduce_sum_async(self, tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        # Named: one is in flight at a time (the caller waits before starting the next), and automatic names
        # number each process's own operations.
        handle = self.hvd.allreduce_async(tensor, op=self.hvd.Sum, name="horovod_train.all_reduce_sum_async")
        return lambda: self.wait(handle)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.wait(self.hvd.allgather_async(tensor))

    def broadcast_(self, tensor: torch.Tensor) -> None:
        # One explicit name, reused: each call completes before the next, in the same order on every rank.
        # Horovod's automatic names number each process's own operations, which may differ between ranks,
        # and mismatched names hang the collective.
        self.wait(self.hvd.broadcast_async_(tensor, root_rank=0, name="horovod_train.broadcast_"))

    def local_main_first(self, work: Any) -> Any:
        # A worker that joins an elastic job runs this setup alone, so it must not wait in a collective
        # for the others: every rank does the work, cached and written atomically.
        return work() if self.options.elastic else super().local_main_first(work)

    def barrier(self) -> None:
        # hvd.barrier() has no asynchronous form: a one-element all-reduce waits for every rank the same way.
        self.all_reduce_sum(torch.zeros(1, device=self.device), name="horovod_train.barrier")

    def describe(self) -> dict[str, Any]:
        hvd = self.hvd
        described = {
            **super().describe(),
            "controller": "mpi" if hvd.mpi_enabled() else "gloo",
            "nccl_built": bool(hvd.nccl_built()),
            "compression": self.options.compression,
            "op": self.options.op,
            "horovod_env": getattr(self, "horovod_env", {}),
            # hvd.DistributedOptimizer's groups: a count of buckets (or of groups), or null (per tensor)
            "gradient_groups": getattr(self, "gradient_groups", None),
        }
        if self.options.elastic:  # recorded in run_config.json: how a joining worker recognises its job
            described["launch_id"] = elastic.launch_id()
        return described

    def shutdown(self) -> None:
        self.hvd.shutdown()


def rank_dependent_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """What rank 0 broadcasts at the start: the parameters that train, and the buffers. Frozen weights (LoRA's
    base model) come from the same checkpoint, or the same seeded init, on every rank: sending them would only
    cost time (a 7B base model is 28 GB in fp32).

    Detached views, as ``state_dict()`` gives (same storage: the broadcast still lands in the parameters). A Horovod
    built without GPU support broadcasts a CUDA tensor through a host copy and writes the result back with ``copy_``
    on its background thread, where autograd is on: into a parameter itself that raises "a leaf Variable that
    requires grad is being used in an in-place operation" and aborts every rank (the GPU check's two ranks on one
    GPU found it)."""
    state = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    state.update(model.named_buffers())
    return state
