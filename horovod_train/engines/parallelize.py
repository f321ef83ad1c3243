"""The parallelize parts (torchtitan's parallelize functions over one mesh): how the model and its optimizer are
made parallel over the engine's mesh (mesh.py), and so how their gradients are reduced, accumulated and clipped.

- ``Replicate``: DDP over a mesh of replicas: the whole model on every rank, its gradients all-reduced in buckets;
  with ``shard_optimizer`` (ZeRO-1) AdamW's state split over the ranks by torch's ZeroRedundancyOptimizer.
- ``FullyShard``: FSDP2's ``fully_shard`` per transformer block, then the root, over a 1-D mesh (fsdp: the world
  shards) or a 2-D one (HSDP: replicas x shards, the gradient reduce-scattered within a replica's shard group and
  all-reduced across replicas).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from horovod_train.common.errors import UsageError
from horovod_train.engines.base import clip_gradient, clip_whole_and_step
from horovod_train.engines.ddp_options import DDPArguments
from horovod_train.engines.fsdp_options import FSDPArguments
from horovod_train.engines.mesh import ParallelDims

if TYPE_CHECKING:
    from horovod_train.config.run_config import RunConfig


class Placed(Protocol):
    """What a parallelize part asks of its engine: this rank's device and place, the mesh (built at setup)."""

    device: torch.device
    mesh: DeviceMesh | None

    @property
    def is_main(self) -> bool: ...


class Replicate:
    """DDP: the constructor broadcasts rank 0's parameters and buffers; DDP's reducer all-reduces the gradients in
    ``--ddp_bucket_cap_mb`` buckets as backward produces them, and skips it (``no_sync``) for all but the last
    micro-step."""

    forward_is_collective = False

    def __init__(self, engine: Placed, config: RunConfig, shard_optimizer: bool = False) -> None:
        self.engine, self.options, self.shard_optimizer = engine, config.options(DDPArguments), shard_optimizer
        if self.options.ddp_bucket_cap_mb <= 0:
            raise UsageError(f"--ddp_bucket_cap_mb must be > 0 (got {self.options.ddp_bucket_cap_mb})", "pass e.g. 25")
        self.wrapped: DistributedDataParallel | None = None  # released before the process group (release)

    def dims(self, world_size: int, local_world_size: int) -> ParallelDims:
        return ParallelDims.replicated(world_size)

    def builds_model_on_meta(self) -> bool:
        return False

    def prepare(
        self, model: nn.Module, build_optimizer: Callable[[nn.Module], Optimizer]
    ) -> tuple[nn.Module, Optimizer]:
        return self.wrap(model, build_optimizer(model))

    def wrap(self, model: nn.Module, optimizer: Optimizer) -> tuple[nn.Module, Optimizer]:
        device = self.engine.device
        model.to(device)  # in place: the optimizer's parameters stay the same objects
        wrapped = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=self.options.ddp_bucket_cap_mb,
            gradient_as_bucket_view=True,
            find_unused_parameters=self.options.ddp_find_unused_parameters,
            device_mesh=self.engine.mesh,
        )
        self.wrapped = wrapped
        return wrapped, sharded_like(optimizer) if self.shard_optimizer else optimizer

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def accumulation_context(self, model: nn.Module, is_last_micro_step: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if is_last_micro_step else model.no_sync()

    def clip_and_step(
        self, model: nn.Module, optimizer: Optimizer, max_grad_norm: float, scaler: Any = None
    ) -> torch.Tensor:
        """The whole averaged gradient is on every rank: clipped as one process's; its norm before clipping."""
        return clip_whole_and_step(model, optimizer, max_grad_norm, scaler)

    def describe(self) -> dict[str, Any]:
        return {"ddp_bucket_cap_mb": self.options.ddp_bucket_cap_mb}

    def release(self) -> None:
        if self.wrapped is not None:
            release_reducer(self.wrapped)
            self.wrapped = None


class FullyShard:
    """FSDP2: a block's parameters all-gathered (within the shard group) before its forward and again before its
    backward, its gradients reduce-scattered after (and, with replicas, all-reduced across them)."""

    forward_is_collective = True  # every block's forward all-gathers

    def __init__(self, engine: Placed, config: RunConfig) -> None:
        self.engine, self.training = engine, config.training
        options = config.options(FSDPArguments)
        self.reshard_after_forward = options.fsdp_reshard_after_forward
        self.replicate_degree = options.fsdp_replicate_degree
        if self.training.fp16:
            raise UsageError(
                "--engine fsdp cannot use --fp16: its loss scaler would have to find an inf in every rank's shard of "
                "the gradient, and FSDP2 has no such sharded scaler",
                "use --bf16 (no loss scaling needed), or --engine zero1 or ddp with --fp16",
            )
        if config.model.use_peft:
            raise UsageError(
                "--engine fsdp does not train LoRA adapters (--use_peft): the merged checkpoint needs the whole peft "
                "model on rank 0",
                "use --engine zero1 or ddp with --use_peft (LoRA's trained state is small), or drop --use_peft",
            )

    def dims(self, world_size: int, local_world_size: int) -> ParallelDims:
        return ParallelDims.sharded(world_size, local_world_size, self.replicate_degree)

    def builds_model_on_meta(self) -> bool:
        """Ranks but 0 build only the model's shape: their shards are filled from rank 0's model."""
        return not self.engine.is_main

    def prepare(
        self, model: nn.Module, build_optimizer: Callable[[nn.Module], Optimizer]
    ) -> tuple[nn.Module, Optimizer]:
        shard(model, self.engine.mesh, self.engine.device, self.engine.is_main, self.reshard_after_forward,
              self.training.bf16)  # fmt: skip
        return model, build_optimizer(model)  # over the shards: each rank's AdamW steps its own

    def wrap(self, model: nn.Module, optimizer: Optimizer) -> tuple[nn.Module, Optimizer]:
        """For a caller that built the optimizer first: it has no state yet, so it is built again over the shards."""
        names = {id(p): n for n, p in model.named_parameters()}
        groups = [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]

        def rebuilt(sharded: nn.Module) -> Optimizer:
            params = dict(sharded.named_parameters())
            settings = [{**group, "params": [params[n] for n in named]}
                        for group, named in zip(optimizer.param_groups, groups, strict=True)]  # fmt: skip
            return type(optimizer)(settings)

        return self.prepare(model, rebuilt)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    @contextlib.contextmanager
    def accumulation_context(self, model: nn.Module, is_last_micro_step: bool) -> Iterator[None]:
        # Gradients of the other micro-steps accumulate unsharded: one reduce-scatter per optimizer step.
        model.set_requires_gradient_sync(is_last_micro_step)
        yield

    def clip_and_step(
        self, model: nn.Module, optimizer: Optimizer, max_grad_norm: float, scaler: Any = None
    ) -> torch.Tensor:
        # The norm of the whole gradient: the shard group's norms combined (computed at every step: grad_norm).
        norm = clip_gradient(model.parameters(), max_grad_norm, whole_norm)
        optimizer.step()
        return norm

    def describe(self) -> dict[str, Any]:
        return {"reshard_after_forward": self.reshard_after_forward,
                "param_dtype": "bfloat16" if self.training.bf16 else "float32"}  # fmt: skip

    def release(self) -> None:
        pass


def shard(model: nn.Module, mesh: DeviceMesh, device: torch.device, is_main: bool, reshard_after_forward: bool,
          bf16: bool) -> None:  # fmt: skip
    """Each block, then the root, over ``mesh``; every rank's shards filled from rank 0's model (the others built
    on meta)."""
    whole = model.state_dict() if is_main else {}  # rank 0's tensors: sharding replaces the parameters
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
        else MixedPrecisionPolicy()  # fmt: skip
    for module in [*transformer_blocks(model), model]:
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        model.to_empty(device=device)
    else:
        model.to(device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, whole, options=options)
    for buffer in model.buffers():  # those outside the state dict too (rotary frequencies, position ids)
        dist.broadcast(buffer, src=0)


def whole_norm(norm: torch.Tensor) -> torch.Tensor:
    """A norm of DTensor shards (a collective: each rank's shards' norms combined), as a plain tensor."""
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the children of its largest ``ModuleList`` whose children are all of one
    class (BertLayer, Qwen2DecoderLayer, ModernBertEncoderLayer, ...), found without a list of names per family."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0
             and len({type(child) for child in m}) == 1]  # fmt: skip
    if not lists:
        return []
    return list(max(lists, key=lambda m: sum(p.numel() for p in m.parameters())))


def sharded_like(optimizer: Optimizer) -> ZeroRedundancyOptimizer:
    """A ZeroRedundancyOptimizer of ``optimizer``'s class, groups and settings (it has no state yet): the groups'
    parameters are numbered as ``optimizer``'s, so its consolidated state dict is the one ``optimizer`` would have."""
    accepted = inspect.signature(type(optimizer)).parameters
    settings = {k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params"}
    groups = [dict(group) for group in optimizer.param_groups]
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **settings)


def release_reducer(model: DistributedDataParallel) -> None:
    """Free DDP's reducer while the process group is still registered. The reducer holds the group: freed after
    ``destroy_process_group`` (when the caller's last reference to the model goes), it destroys the Gloo group
    itself, joining the group's worker threads while holding the GIL, and a worker that is still freeing a finished
    all-reduce needs the GIL for it (a Python object in the work's thread-local state): a deadlock after the last
    step, seen about one run in three with --ddp_find_unused_parameters. Freed here, the reducer leaves the group to
    ``destroy_process_group``, whose binding releases the GIL while the threads stop."""
    model.logger = None  # the logger holds the reducer too
    model.reducer = None
