"""FSDP2: the model's parameters, gradients and AdamW's state sharded over the ranks (torch's ``fully_shard``).

Each transformer block (found from the model: the largest list of identical modules) is one FSDP unit, then the
root takes the rest (embeddings, head). A block's parameters are all-gathered before its forward and again before
its backward, and its gradients reduce-scattered after; ``--fsdp_reshard_after_forward true`` frees the gathered
parameters between the two (ZeRO-3), ``false`` keeps them from forward to backward (ZeRO-2: more memory, one
all-gather less per block). Per parameter a rank holds 16/W bytes of state (fp32 weights, gradient, AdamW's two
moments) plus one block gathered at a time.

The launchers, process group and collectives are DDP's (NCCL on GPUs, Gloo on CPUs). Ranks other than 0 build
the model on the meta device; once sharded, every rank's shards are filled from rank 0's model, so no rank but 0
ever holds the whole model. A checkpoint is written by every rank at once, nobody gathering (state_io): each rank
writes its shards' rows into the whole model's ``model.safetensors`` and its optimizer shards with DCP, and
resuming reads only its own part, at any world size; another engine reads it whole. The final output holds the
whole model, gathered on rank 0 one tensor at a time.

``--bf16`` is FSDP's mixed precision (bf16 parameters in forward and backward, fp32 gradient reduction and
master weights). Refused, each in one line: ``--fp16`` (its loss scaler would have to see every rank's shards of
the gradient to find an inf; FSDP2 has no such scaler), ``--use_peft`` (LoRA's merged checkpoint needs the whole
peft model on rank 0, and LoRA's trained state is small enough for ddp or zero1 to keep whole).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim import Optimizer

from horovod_train import checkpoint as ckpt
from horovod_train.checksums import tensors_checksum
from horovod_train.engines import state_io
from horovod_train.engines.base import load_keeping_implementation
from horovod_train.engines.ddp import DDPEngine
from horovod_train.engines.state_io import BackgroundWrite
from horovod_train.errors import UsageError

if TYPE_CHECKING:
    from horovod_train.config import RunConfig


class FSDPEngine(DDPEngine):
    name = "fsdp"
    forward_is_collective = True
    run_variants: ClassVar[dict[str, tuple[str, ...]]] = {"zero2": ("--fsdp_reshard_after_forward", "false")}

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.reshard_after_forward = config.fsdp.fsdp_reshard_after_forward
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

    @property
    def builds_model_on_meta(self) -> bool:
        return not self.is_main

    def prepare(
        self, model: nn.Module, build_optimizer: Callable[[nn.Module], Optimizer]
    ) -> tuple[nn.Module, Optimizer]:
        self.shard(model)
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

    def shard(self, model: nn.Module) -> None:
        """Each block, then the root; every rank's shards filled from rank 0's model (the others built on meta)."""
        whole = model.state_dict() if self.is_main else {}  # rank 0's tensors: sharding replaces the parameters
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.training.bf16 \
            else MixedPrecisionPolicy()  # fmt: skip
        for module in [*transformer_blocks(model), model]:
            fully_shard(module, mesh=mesh, reshard_after_forward=self.reshard_after_forward, mp_policy=policy)
        if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
            model.to_empty(device=self.device)
        else:
            model.to(self.device)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, whole, options=options)
        for buffer in model.buffers():  # those outside the state dict too (rotary frequencies, position ids)
            dist.broadcast(buffer, src=0)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    @contextlib.contextmanager
    def accumulation_context(self, model: nn.Module, is_last_micro_step: bool) -> Iterator[None]:
        # Gradients of the other micro-steps accumulate unsharded: one reduce-scatter per optimizer step.
        model.set_requires_gradient_sync(is_last_micro_step)
        yield

    def clip_and_step(self, model: nn.Module, optimizer: Optimizer, max_grad_norm: float, scaler: Any = None) -> None:
        if max_grad_norm > 0:  # the norm of the whole gradient: each rank's shards' norms combined
            parameters = [p for p in model.parameters() if p.grad is not None]
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
            torch.nn.utils.clip_grads_with_norm_(parameters, max_grad_norm, norm)
        optimizer.step()

    def full_model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        # One tensor gathered at a time, kept on rank 0's CPU only.
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_model_state(self, model: nn.Module, tensors: dict[str, torch.Tensor] | Path) -> None:
        # Each rank copies the rows of its own shards: from whole tensors, or read from a checkpoint's model file.
        if isinstance(tensors, Path):
            with state_io.ModelFile(tensors / ckpt.MODEL_FILE) as source:
                state_io.load_model_rows(model.state_dict(), source)
        else:
            state_io.load_model_rows(model.state_dict(), tensors)

    sharded_state = True

    def save_state_shards(
        self, model: nn.Module, optimizer: Optimizer, directory: Path, background: BackgroundWrite | None = None
    ) -> dict[str, str]:
        model_file = directory / ckpt.MODEL_FILE
        state_io.on_every_rank(self.gather_objects, lambda: state_io.write_model_rows(
            self.distinct_state(model), model_file, self.is_main, self.barrier, background))  # fmt: skip
        state_io.on_every_rank(self.gather_objects, lambda: state_io.save_optimizer_shards(
            optimizer.state_dict()["state"], directory / state_io.OPTIMIZER_DIR, background))  # fmt: skip
        return state_io.written_digests(directory, self.rank, background)

    def distinct_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The model's state dict (its shards) with each tied tensor once, under the name ``save_pretrained`` keeps
        (as checkpoint.distinct_tensors does for a whole state dict)."""
        state = model.state_dict()
        owners: dict[int, list[str]] = {}
        for name, tensor in [*model.named_parameters(remove_duplicate=False),
                             *model.named_buffers(remove_duplicate=False)]:  # fmt: skip
            if name in state:
                owners.setdefault(id(tensor), []).append(name)
        copies = ckpt.tied_copies(model)
        kept = [next((n for n in names if n not in copies), names[0]) for names in owners.values()]
        return {name: state[name] for name in sorted(kept)}

    def full_optimizer_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any] | None:
        local = optimizer.state_dict()  # numbered as every engine's; its tensors are this rank's shards
        state = {index: {key: self.gathered(value) for key, value in entry.items()}
                 for index, entry in local["state"].items()}  # fmt: skip
        return {"state": state, "param_groups": local["param_groups"]} if self.is_main else None

    def gathered(self, value: Any) -> Any:
        """A shard's whole tensor, on rank 0's CPU (collective: every rank asks for the same in the same order)."""
        if not isinstance(value, DTensor):
            return value
        whole = value.full_tensor().cpu()
        return whole if self.is_main else None

    def load_optimizer_state(self, model: nn.Module, optimizer: Optimizer, state: dict[str, Any]) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state = state_io.optimizer_source(state)
        if state_io.SHARDED in state:  # each rank reads its shards, resharded from the saved world size
            loaded = state_io.load_optimizer_shards(Path(state[state_io.SHARDED]), params)
            load_keeping_implementation(optimizer, {"state": loaded, "param_groups": state["param_groups"]})
            return
        sharded = {index: {key: shard_like(value, params[index]) for key, value in entry.items()}
                   for index, entry in state["state"].items()}  # fmt: skip
        load_keeping_implementation(optimizer, {"state": sharded, "param_groups": state["param_groups"]})

    def parameter_checksum(self, model: nn.Module) -> int:
        named = sorted(model.state_dict().items())
        return tensors_checksum((n, t.full_tensor() if isinstance(t, DTensor) else t) for n, t in named)

    @classmethod
    def state_bytes_per_rank(cls, params: int, trainable: int, world_size: int) -> float:
        return (4 * params + 12 * trainable) / world_size

    @classmethod
    def save_gather_bytes(cls, params: int, trainable: int, world_size: int) -> float:
        """The run's final output, the whole weights gathered on rank 0's CPU (full_model_state); checkpoints are
        written in shards (save_state_shards), nothing gathered."""
        return 4 * params * (world_size - 1) / world_size

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "reshard_after_forward": self.reshard_after_forward,
                "param_dtype": "bfloat16" if self.training.bf16 else "float32"}  # fmt: skip


def shard_like(value: Any, param: torch.Tensor) -> Any:
    """This rank's shard of a whole tensor of the optimizer's state for ``param`` (a scalar such as AdamW's step
    stays as it is)."""
    if not isinstance(param, DTensor) or not torch.is_tensor(value) or value.shape != param.shape:
        return value
    local = value.to(param.device_mesh.device_type)
    return distribute_tensor(local, param.device_mesh, param.placements, src_data_rank=None)  # no communication


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the children of its largest ``ModuleList`` whose children are all of one
    class (BertLayer, Qwen2DecoderLayer, ModernBertEncoderLayer, ...), found without a list of names per family."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0
             and len({type(child) for child in m}) == 1]  # fmt: skip
    if not lists:
        return []
    return list(max(lists, key=lambda m: sum(p.numel() for p in m.parameters())))
