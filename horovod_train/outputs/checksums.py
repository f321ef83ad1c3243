"""Digests of a model's parameters: equal across ranks exactly when they are bit-identical (the results'
``param_checksum_per_rank``). Torch alone, so that what only joins the ranks (doctor) need not import transformers'
models."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


def param_checksum(model: torch.nn.Module) -> int:
    """A 63-bit digest of every parameter's bytes: equal across ranks only if bit-identical."""
    return tensors_checksum(sorted(model.state_dict().items()))


def tensors_checksum(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """``param_checksum`` of a state dict's (name, tensor) pairs in name order (an iterator: one tensor at a time
    need exist, as a sharded engine gathers them)."""
    h = hashlib.sha256()
    for name, tensor in named_tensors:
        h.update(name.encode())
        # Raw bytes, any dtype: numpy has no bfloat16.
        h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest()[:8], "little") >> 1
