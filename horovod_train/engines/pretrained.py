"""The model users take away, from a model no rank holds whole (fsdp): ``save_pretrained``'s layout, gathered and
written one tensor at a time.

The layout is transformers' own: the tensors split into files of at most ``--max_shard_size`` by huggingface_hub's
``split_torch_state_dict_into_shards`` (what ``save_pretrained`` calls, in the state dict's order: one file,
``model.safetensors``, when the model fits; else ``model-00001-of-0000N.safetensors`` and
``model.safetensors.index.json``), and beside them the files ``save_pretrained`` writes with the weights
(``config.json``, ``generation_config.json`` for a model that generates). The plan needs the tensors' shapes
alone, so every rank makes the same one. Then each tensor in turn is assembled whole on every rank (one
``DTensor.full_tensor``, an all-gather), rank 0 appends its bytes to the open file, and every rank frees it: at no
point does a rank hold more than its shards and one whole tensor, and rank 0 buffers no file (each file's header,
computed from the shapes, is written first: state_io.safetensors_layout).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from torch.distributed.tensor import DTensor

from horovod_train.engines import state_io

INDEX_FILE = "model.safetensors.index.json"
FILE_PATTERN = "model{suffix}.safetensors"


def shard_plan(tensors: dict[str, torch.Tensor], max_shard_size: int | str) -> Any:
    """huggingface_hub's split of ``tensors`` into files (its ``StateDictSplit``), from their whole shapes and
    dtypes: the same on every rank, whatever each holds of them."""
    shapes = {name: torch.empty(tensor.shape, dtype=tensor.dtype, device="meta") for name, tensor in tensors.items()}
    return split_torch_state_dict_into_shards(shapes, filename_pattern=FILE_PATTERN, max_shard_size=max_shard_size)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """Collective for a DTensor (every rank asks for the same tensor in the same order): the whole tensor."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def write_from_shards(
    model: Any, tensors: dict[str, torch.Tensor], directory: Path, max_shard_size: int | str, is_main: bool,
    gather: Callable[[Any], list[Any]],
) -> list[str]:  # fmt: skip
    """Collective: ``model`` (a transformers model, sharded) in ``directory`` as ``save_pretrained`` writes it, from
    ``tensors`` (each rank's shards, each tied tensor once, under the names ``save_pretrained`` keeps). Rank 0 writes;
    its failure to write (a full disk) is every rank's error once the gathers are done (state_io.on_every_rank).
    Returns the weight files' names (rank 0)."""
    ignored = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    tensors = {name: tensor for name, tensor in tensors.items() if name not in ignored}
    plan = shard_plan(tensors, max_shard_size)

    def write() -> list[str]:
        failure: OSError | None = None
        for filename, names in plan.filename_to_tensors.items():
            prefix, _, _ = state_io.safetensors_layout({name: tensors[name] for name in names})
            try:
                f = (directory / filename).open("wb") if is_main and failure is None else None
            except OSError as error:
                failure, f = error, None
            if f is not None:
                f.write(prefix)
            for name in names:
                full = whole(tensors[name])  # every rank gathers, even once rank 0 cannot write: the others wait
                if f is not None:
                    try:
                        f.write(full.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
                    except OSError as error:
                        failure = error
                        f.close()
                        f = None
                del full
            if f is not None:
                f.close()
        if failure is not None:
            raise failure
        if is_main:
            write_index(model, plan, directory)
            write_config(model, directory)
        return list(plan.filename_to_tensors)

    return state_io.on_every_rank(gather, write)


def write_index(model: Any, plan: Any, directory: Path) -> None:
    """``model.safetensors.index.json`` where the weights are split, as ``save_pretrained`` writes it."""
    if not plan.is_sharded:
        return
    index = {
        "metadata": {"total_parameters": model.num_parameters(), **plan.metadata},
        "weight_map": plan.tensor_to_filename,
    }
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def write_config(model: Any, directory: Path) -> None:
    """What ``save_pretrained`` writes beside the weights (its own steps: the dtype and class recorded in the
    config, a remote-code model's modules, the generation settings of a model that generates)."""
    from transformers.dynamic_module_utils import custom_object_save

    model.config.dtype = str(model.dtype).split(".")[1]
    # FSDP2 renames the class it shards (FSDPLlamaForSequenceClassification); the config names the model's own
    model.config.architectures = [type(model).__name__.removeprefix("FSDP")]
    if model.is_remote_code():
        custom_object_save(model, directory, config=model.config)
    model.config.save_pretrained(directory)
    if model.can_generate():
        model.generation_config.save_pretrained(directory)
