"""Comparisons shared by tests: saved parameters, a broadcast between threads standing for ranks."""

from __future__ import annotations

import queue
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors.torch import load_file

from horovod_train.engines.payload import broadcast_from_root


def max_abs_diff(a: Path, b: Path) -> float:
    left, right = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert left.keys() == right.keys()
    return max(float((left[k] - right[k]).abs().max()) for k in left)


def threads_broadcast(objects: list, chunk_bytes: int) -> list:
    """payload.broadcast_from_root between threads standing for ranks, over an in-memory wire."""
    wires = [queue.Queue() for _ in objects[1:]]

    def broadcast_from(rank: int) -> Callable[[torch.Tensor], None]:
        def broadcast_(tensor: torch.Tensor) -> None:
            assert tensor.is_contiguous() and tensor.numel() * tensor.element_size() <= max(chunk_bytes, 8)
            if rank == 0:
                for wire in wires:
                    wire.put(tensor.clone())
            else:
                sent = wires[rank - 1].get(timeout=10)
                assert (sent.dtype, sent.shape) == (tensor.dtype, tensor.shape)
                tensor.copy_(sent)

        return broadcast_

    with ThreadPoolExecutor(len(objects)) as pool:
        futures = [
            pool.submit(broadcast_from_root, obj, broadcast_from(rank), rank == 0, chunk_bytes)
            for rank, obj in enumerate(objects)
        ]
        return [future.result(timeout=30) for future in futures]
