"""Rank 0's object on every rank, its tensors sent as raw bytes: what a resume broadcasts (a checkpoint).

The object is pickled with each tensor replaced by a placeholder (index, dtype, shape): a skeleton of a few
kilobytes even for a large model. Every rank then receives each tensor's bytes straight into a tensor it
allocated, in fixed-size chunks, so a rank holds one copy of the payload: no pickled copy of the tensor
data, no copy per rank, and no collective over 2 GiB (where int32 sizes and counts overflow).

The skeleton is unpickled with an allow-list (``ALLOWED``): the containers and scalars of Python, NumPy arrays
and scalars, torch dtypes and sizes, and the errors a read can end in: what a checkpoint, its trainer state and
its RNG states hold. Anything else (a class whose unpickling would run code) is refused, so a rank that receives
bytes from a peer it should not trust runs nothing but these constructors (docs/failures.md).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any

import torch

CHUNK_BYTES = 128 * 2**20  # bytes per collective
Broadcast = Callable[[torch.Tensor], None]  # overwrites a CPU tensor with rank 0's, in place


class _SkeletonPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list[torch.Tensor] = []
        self.indices: dict[int, int] = {}  # id(tensor) -> index: a tensor met twice is sent once

    def persistent_id(self, obj: Any) -> tuple[int, torch.dtype, tuple[int, ...]] | None:
        if not isinstance(obj, torch.Tensor) or obj.layout != torch.strided:
            return None  # pickled as usual
        index = self.indices.setdefault(id(obj), len(self.tensors))
        if index == len(self.tensors):
            self.tensors.append(obj)
        return index, obj.dtype, tuple(obj.shape)


ALLOWED = {
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"), ("builtins", "bytearray"),
    ("collections", "OrderedDict"), ("pathlib", "PosixPath"), ("torch", "Size"),
    ("numpy", "dtype"), ("numpy", "ndarray"),
    *((module, name) for module in ("numpy.core.multiarray", "numpy._core.multiarray") for name in ("_reconstruct",
                                                                                                    "scalar")),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("horovod_train.common.errors", "UsageError"),
}  # fmt: skip


class _SkeletonUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.tensors: list[torch.Tensor] = []

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a resume payload holds {module}.{name}, which no checkpoint holds: refused")

    def persistent_load(self, pid: tuple[int, torch.dtype, tuple[int, ...]]) -> torch.Tensor:
        if not _is_placeholder(pid) or pid[0] > len(self.tensors):
            raise pickle.UnpicklingError(f"a resume payload holds a malformed tensor placeholder {pid!r}: refused")
        index, dtype, shape = pid
        if index == len(self.tensors):  # first met in the order the pickler numbered them
            self.tensors.append(torch.empty(shape, dtype=dtype))
        return self.tensors[index]


def _is_placeholder(pid: Any) -> bool:
    """(index, dtype, shape) as _SkeletonPickler writes it."""
    return (isinstance(pid, tuple) and len(pid) == 3 and type(pid[0]) is int and pid[0] >= 0
            and isinstance(pid[1], torch.dtype) and isinstance(pid[2], tuple)
            and all(type(n) is int and n >= 0 for n in pid[2]))  # fmt: skip


def broadcast_from_root(obj: Any, broadcast_: Broadcast, is_root: bool, chunk_bytes: int = CHUNK_BYTES) -> Any:
    """Rank 0's ``obj`` (``is_root``), rebuilt on the other ranks, whose ``obj`` is ignored. Tensors arrive
    contiguous and on the CPU; rank 0 gets its own object back."""
    tensors: list[torch.Tensor] = []
    skeleton = torch.empty(0, dtype=torch.uint8)
    if is_root:
        file = io.BytesIO()
        pickler = _SkeletonPickler(file)
        pickler.dump(obj)
        skeleton, tensors = torch.frombuffer(bytearray(file.getvalue()), dtype=torch.uint8), pickler.tensors
    size = torch.tensor([skeleton.numel()], dtype=torch.int64)
    broadcast_(size)
    if not is_root:
        skeleton = torch.empty(int(size), dtype=torch.uint8)
    _send_bytes(skeleton, broadcast_, chunk_bytes)
    if not is_root:
        unpickler = _SkeletonUnpickler(io.BytesIO(skeleton.numpy().tobytes()))
        obj, tensors = unpickler.load(), unpickler.tensors
    for tensor in tensors:
        _send_bytes(tensor, broadcast_, chunk_bytes)
    return obj


def _send_bytes(tensor: torch.Tensor, broadcast_: Broadcast, chunk_bytes: int) -> None:
    # Raw bytes: any dtype (bool, bfloat16, ...) travels as uint8. A receiver's tensor is contiguous, so
    # these are views of it; rank 0's non-contiguous ones are copied, and its GPU ones moved a chunk at a time.
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    for start in range(0, data.numel(), chunk_bytes):
        broadcast_(data[start : start + chunk_bytes].cpu())
