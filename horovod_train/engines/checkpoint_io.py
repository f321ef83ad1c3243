"""The state-I/O parts (Lightning's CheckpointIO): how an engine's model and optimizer state, however the ranks
hold it, is read whole, written into a checkpoint and loaded back. state_io.py holds the sharded files' formats;
these parts choose, per way of holding the state, what each rank reads and writes.

- ``WholeState``: every rank holds the whole model and optimizer (single, dp, horovod, ddp): rank 0 writes them
  gathered by nobody, and a resume loads them whole on every rank.
- ``OptimizerShards``: the whole model, the optimizer's state split by parameter (zero1): each rank writes and reads
  the state of the parameters it steps.
- ``Shards``: every tensor a DTensor over the mesh (fsdp, HSDP): each rank writes its rows of the model file (HSDP:
  the first replica's ranks, each row once) and its optimizer shards (DCP writes a replicated one once), and reads
  only its own part back, at any world size or mesh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim import Optimizer

from horovod_train.engines import pretrained, state_io
from horovod_train.engines.state_io import BackgroundWrite
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.checksums import param_checksum, tensors_checksum


class Ranks(Protocol):
    """What a state-I/O part asks of its engine: the ranks, their collectives, the model inside its wrapper."""

    name: str
    rank: int

    @property
    def is_main(self) -> bool: ...

    def unwrap(self, model: nn.Module) -> nn.Module: ...

    def gather_objects(self, obj: Any) -> list[Any]: ...

    def barrier(self) -> None: ...


class WholeState:
    # True where every rank writes and reads its own part of a checkpoint's model and optimizer state (state_io);
    # False: rank 0 writes the state gathered by the methods below, and reads it for every rank.
    sharded = False

    def __init__(self, engine: Ranks) -> None:
        self.engine = engine  # its rank, collectives and unwrapped model

    def full_model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Collective: the whole model's state dict on rank 0, {} on the others (the model's own tensors here)."""
        return self.engine.unwrap(model).state_dict() if self.engine.is_main else {}

    def load_model_state(self, model: nn.Module, tensors: dict[str, torch.Tensor] | Path) -> None:
        if isinstance(tensors, Path):
            tensors = ckpt.read_model_tensors(tensors)
        module = self.engine.unwrap(model)
        module.load_state_dict(ckpt.model_state(tensors, module))

    def full_optimizer_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any] | None:
        return optimizer.state_dict() if self.engine.is_main else None

    def load_optimizer_state(self, model: nn.Module, optimizer: Optimizer, state: dict[str, Any]) -> None:
        load_keeping_implementation(optimizer, state)

    def save_state_shards(
        self, model: nn.Module, optimizer: Optimizer, directory: Path, background: BackgroundWrite | None = None
    ) -> dict[str, str]:
        raise NotImplementedError(f"{self.engine.name} writes its checkpoint's state whole, from rank 0")

    def write_model_shards(self, model: nn.Module, directory: Path, max_shard_size: int | str) -> bool:
        """False: rank 0 holds the model whole, and writes the final output with its ``save_pretrained``."""
        return False

    def parameter_checksum(self, model: nn.Module) -> int:
        return param_checksum(self.engine.unwrap(model))

    def written(self, directory: Path, background: BackgroundWrite | None = None) -> dict[str, str]:
        """{file: SHA-256} of the optimizer files this rank wrote into a checkpoint's ``directory`` ({} with
        ``background``: its write computes them once it has written, state_io.written_digests)."""
        return state_io.written_digests(directory, self.engine.rank, background)


class OptimizerShards(WholeState):
    """The model whole on every rank (rank 0 writes it); the optimizer's state, each rank the parameters it steps
    (torch's ZeroRedundancyOptimizer: ``optimizer.optim`` is this rank's)."""

    sharded = True

    def save_state_shards(
        self, model: nn.Module, optimizer: Optimizer, directory: Path, background: BackgroundWrite | None = None
    ) -> dict[str, str]:
        indices = state_io.parameter_indices(optimizer)
        local = {indices[id(p)]: entry for p, entry in optimizer.optim.state.items()}
        state_io.on_every_rank(self.engine.gather_objects, lambda: state_io.save_optimizer_shards(
            local, directory / state_io.OPTIMIZER_DIR, background))  # fmt: skip
        return self.written(directory, background)

    def load_optimizer_state(self, model: nn.Module, optimizer: Optimizer, state: dict[str, Any]) -> None:
        state = state_io.optimizer_source(state)
        if state_io.SHARDED in state:  # each rank reads the state of the parameters it steps
            params = [p for group in optimizer.param_groups for p in group["params"]]
            mine = {id(p) for group in optimizer.optim.param_groups for p in group["params"]}
            loaded = state_io.load_optimizer_shards(Path(state[state_io.SHARDED]), params,
                                                    wanted=lambda index: id(params[index]) in mine)  # fmt: skip
            state = {"state": loaded, "param_groups": state["param_groups"]}
        load_keeping_implementation(optimizer, state)

    def full_optimizer_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any] | None:
        optimizer.consolidate_state_dict(to=0)  # collective: every rank sends its share to rank 0
        return super().full_optimizer_state(model, optimizer)


class Shards(WholeState):
    """Every parameter, gradient and optimizer tensor a DTensor over the mesh (its shard group's rows; the replicas
    of HSDP hold the same rows)."""

    sharded = True

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

    def write_model_shards(self, model: nn.Module, directory: Path, max_shard_size: int | str) -> bool:
        """The final model from the shards, in save_pretrained's layout: a tensor gathered whole, written by rank 0
        and freed at a time (engines/pretrained.py)."""
        engine = self.engine
        pretrained.write_from_shards(model, distinct_state(model), directory, max_shard_size, engine.is_main,
                                     engine.gather_objects)  # fmt: skip
        return True

    def save_state_shards(
        self, model: nn.Module, optimizer: Optimizer, directory: Path, background: BackgroundWrite | None = None
    ) -> dict[str, str]:
        engine, model_file = self.engine, directory / ckpt.MODEL_FILE
        state_io.on_every_rank(engine.gather_objects, lambda: state_io.write_model_rows(
            distinct_state(model), model_file, engine.is_main, engine.barrier, background))  # fmt: skip
        state_io.on_every_rank(engine.gather_objects, lambda: state_io.save_optimizer_shards(
            optimizer.state_dict()["state"], directory / state_io.OPTIMIZER_DIR, background))  # fmt: skip
        return self.written(directory, background)

    def full_optimizer_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any] | None:
        local = optimizer.state_dict()  # numbered as every engine's; its tensors are this rank's shards
        state = {index: {key: self.gathered(value) for key, value in entry.items()}
                 for index, entry in local["state"].items()}  # fmt: skip
        return {"state": state, "param_groups": local["param_groups"]} if self.engine.is_main else None

    def gathered(self, value: Any) -> Any:
        """A shard's whole tensor, on rank 0's CPU (collective: every rank asks for the same in the same order)."""
        if not isinstance(value, DTensor):
            return value
        whole = value.full_tensor().cpu()
        return whole if self.engine.is_main else None

    def load_optimizer_state(self, model: nn.Module, optimizer: Optimizer, state: dict[str, Any]) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state = state_io.optimizer_source(state)
        if state_io.SHARDED in state:  # each rank reads its shards, resharded from the saved world size and mesh
            loaded = state_io.load_optimizer_shards(Path(state[state_io.SHARDED]), params)
            load_keeping_implementation(optimizer, {"state": loaded, "param_groups": state["param_groups"]})
            return
        sharded = {index: {key: shard_like(value, params[index]) for key, value in entry.items()}
                   for index, entry in state["state"].items()}  # fmt: skip
        load_keeping_implementation(optimizer, {"state": sharded, "param_groups": state["param_groups"]})

    def parameter_checksum(self, model: nn.Module) -> int:
        named = sorted(model.state_dict().items())
        return tensors_checksum((n, t.full_tensor() if isinstance(t, DTensor) else t) for n, t in named)


def distinct_state(model: nn.Module) -> dict[str, torch.Tensor]:
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


def shard_like(value: Any, param: torch.Tensor) -> Any:
    """This rank's shard of a whole tensor of the optimizer's state for ``param`` (a scalar such as AdamW's step
    stays as it is)."""
    if not isinstance(param, DTensor) or not torch.is_tensor(value) or value.shape != param.shape:
        return value
    local = value.to(param.device_mesh.device_type)
    return distribute_tensor(local, param.device_mesh, param.placements, src_data_rank=None)  # no communication


def load_keeping_implementation(optimizer: Optimizer, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(state)``: the groups' settings come back from the checkpoint, the implementation
    (fused or not) stays the one this run asked for."""
    implementation = [group.get("fused") for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, fused in zip(optimizer.param_groups, implementation, strict=True):
        group["fused"] = fused
