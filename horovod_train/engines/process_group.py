"""The engines of torch.distributed (ddp, zero1, fsdp), each assembled from parts over one mesh: the process group
and its collectives (here), how the model is made parallel and its gradients reduced (``parallelize``: a part of
parallelize.py, which also says the mesh's shape: mesh.py), how its state is saved and loaded (``checkpoint_io``:
checkpoint_io.py) and what a rank holds (``memory``: memory.py). An engine is a row of parts, not a subclass of
another engine.

One process per device, NCCL on GPUs and Gloo on CPUs (or, with --ddp_backend gloo, on GPUs: CUDA tensors through
host memory, so ranks may share a GPU). Starts under torchrun, mpirun or srun: horovod_train.launching.environment
turns each launcher's variables into the MASTER_ADDR/RANK/WORLD_SIZE the rendezvous reads (rendezvous.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.optim import Optimizer

from horovod_train import launching
from horovod_train.engines.base import Engine
from horovod_train.engines.ddp_options import DDPArguments
from horovod_train.engines.mesh import ParallelDims
from horovod_train.engines.parallelize import FullyShard, Replicate
from horovod_train.engines.rendezvous import init_process_group
from horovod_train.engines.state_io import BackgroundWrite
from horovod_train.launching import environment

if TYPE_CHECKING:
    from horovod_train.config.run_config import RunConfig


class ProcessGroupEngine(Engine):
    launcher = "plain"
    backend = "gloo"
    # The parts: how the model is made parallel over the mesh (called with the engine and the run's config).
    parallelize: ClassVar[Callable[..., Replicate | FullyShard]]

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.ddp_options = config.options(DDPArguments)
        self.parallelism = type(self).parallelize(self, config)  # refuses what the part cannot do, before setup
        self.dims: ParallelDims | None = None
        self.mesh: DeviceMesh | None = None
        self.background_group: dist.ProcessGroup | None = None  # --save_async's, made at its first save

    def setup(self) -> None:
        env = environment.detect()
        left_over = launching.launcher(env.launcher).left_over(os.environ)  # before export sets them all
        env.export()
        self.launcher = env.launcher
        self.local_rank, self.local_world_size = env.local_rank, env.local_world_size
        self.dims = self.parallelism.dims(env.world_size, env.local_world_size)  # a bad degree: before joining
        options: dict[str, Any] = {}
        cuda = torch.cuda.is_available()
        self.backend = self.ddp_options.backend_on(cuda)
        if cuda:  # by local rank (global ranks exceed a node's GPUs), or the task's only GPU
            self.device, self.device_rule = environment.pin_cuda_device(env.local_rank)
        if self.backend == "nccl":
            options["device_id"] = self.device
        init_process_group(env, self.backend, self.timeout, left_over, **options)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.mesh = self.dims.build(self.device.type, self.timeout)
        self.set_cpu_threads()

    @property
    def timeout(self) -> timedelta:
        """--ddp_timeout, every group's (the default group, the mesh's, the background writes'): long enough for
        rank 0's one-sided work (writing a checkpoint) while the others wait; a hung rank ends them all after it."""
        return timedelta(seconds=self.training.ddp_timeout)

    # ---- the parallelize part ----------------------------------------------------------------------------------
    @property
    def builds_model_on_meta(self) -> bool:
        return self.parallelism.builds_model_on_meta()

    @property
    def forward_is_collective(self) -> bool:  # type: ignore[override]
        return self.parallelism.forward_is_collective

    @property
    def replicate_degree(self) -> int:
        return self.dims.replicate if self.dims is not None and isinstance(self.parallelism, FullyShard) else 1

    def prepare(
        self, model: nn.Module, build_optimizer: Callable[[nn.Module], Optimizer]
    ) -> tuple[nn.Module, Optimizer]:
        return self.parallelism.prepare(model, build_optimizer)

    def wrap(self, model: nn.Module, optimizer: Optimizer) -> tuple[nn.Module, Optimizer]:
        return self.parallelism.wrap(model, optimizer)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return self.parallelism.unwrap(model)

    def accumulation_context(self, model: nn.Module, is_last_micro_step: bool) -> contextlib.AbstractContextManager:
        return self.parallelism.accumulation_context(model, is_last_micro_step)

    def clip_and_step(
        self, model: nn.Module, optimizer: Optimizer, max_grad_norm: float, scaler: Any = None
    ) -> torch.Tensor:
        return self.parallelism.clip_and_step(model, optimizer, max_grad_norm, scaler)

    # ---- the collectives ------------------------------------------------------------------------------------------
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.all_reduce_sum_async(tensor)()

    def all_reduce_sum_async(self, tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        if self.device.type == "cuda" and tensor.device.type == "cpu":
            return self.all_reduce_sum_on_gpu(tensor)
        summed = tensor.to(self.device, copy=True)
        work = dist.all_reduce(summed, op=dist.ReduceOp.SUM, async_op=True)
        return lambda: (work.wait(), summed.to(tensor.device))[1]

    def all_reduce_sum_on_gpu(self, tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        """NCCL sums GPU memory only. Both copies are queued on the stream from pinned memory and the host
        waits for neither: the result is read through an event recorded after the copy back, which the
        GPU has passed by the time it is read a step later (the stop flags), so the host never waits for
        the step in flight. A pageable copy (``tensor.to(device)`` and back) waits for the whole stream."""
        staged = tensor.pin_memory().to(self.device, non_blocking=True)
        work = dist.all_reduce(staged, op=dist.ReduceOp.SUM, async_op=True)
        work.wait()  # NCCL: the current stream waits for the all-reduce, the host does not
        result = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        result.copy_(staged, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return lambda: (copied.synchronize(), result)[1]

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """torch.distributed gathers equal shapes only: pad every rank to the longest, gather, trim."""
        local = tensor.to(self.device)
        length = torch.tensor([local.shape[0]], dtype=torch.int64, device=self.device)
        lengths = [torch.empty_like(length) for _ in range(self.world_size)]
        dist.all_gather(lengths, length)
        sizes = [int(n) for n in lengths]
        padded = local.new_zeros((max(sizes), *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded)
        return torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)]).to(tensor.device)

    def broadcast_(self, tensor: torch.Tensor) -> None:
        staged = tensor.to(self.device)  # NCCL sends GPU memory only: a chunk at a time passes through it
        dist.broadcast(staged, src=0)
        if staged is not tensor:
            tensor.copy_(staged)

    def barrier(self) -> None:
        dist.barrier()

    def describe(self) -> dict[str, Any]:
        mesh = {} if self.dims is None else {"mesh": {"replicate": self.dims.replicate, "shard": self.dims.shard}}
        return {**super().describe(), "launcher": self.launcher, "backend": self.backend, **mesh,
                **self.parallelism.describe()}  # fmt: skip

    def background_write(self) -> BackgroundWrite:
        if self.background_group is None:  # collective: every rank saves at the same step
            self.background_group = dist.new_group(backend="gloo", timeout=self.timeout)
        return BackgroundWrite(self.background_group)

    def shutdown(self) -> None:
        """The groups end here, their threads joined while Python is whole. destroy_process_group shuts every
        group down, but a Gloo group's worker threads are joined only when its last reference goes: the background
        writes' group (ours) and the mesh's (torch's DTensor caches keep the mesh), kept to the interpreter's
        teardown, were joined there: the suspect of a rank that once died at exit after its last save ("terminate
        called without an active exception", pytorch#179291's kind)."""
        self.parallelism.release()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.background_group = None  # its last reference: its threads are joined now
        if self.mesh is not None:  # its groups' last references (torch's private registry, where it has one)
            getattr(self.mesh, "_pg_registry", {}).clear()
