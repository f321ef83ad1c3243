"""Peak memory of this process, the same way for every engine; the memory a run's training state needs."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

from horovod_train.errors import UsageError

GIB = 2**30


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated on ``device``, or the process's peak resident set size on CPU (MiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max_rss / 2**20 if sys.platform == "darwin" else max_rss / 2**10  # bytes on macOS, KiB on Linux


def memory_available(device: torch.device | None = None) -> int:
    """Bytes free for a run now: the machine's MemAvailable (/proc/meminfo: what other processes leave), or on a GPU
    the device's free memory."""
    if device is not None and device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def check_state_fits(engine: str, params: int, state_bytes: float, ranks: int, device: torch.device) -> None:
    """Refuse, before the model is built, a run whose training state (fp32 weights, gradients, AdamW's moments:
    ``state_bytes`` per rank as ``engine`` spreads them, ``ranks`` of them sharing the device's memory) is more than
    the memory free now. Activations come on top: a run that passes may still run out, one refused never fits."""
    need, free = state_bytes * ranks, memory_available(device)
    if need <= free:
        return
    where = f"{ranks} rank{'s' if ranks > 1 else ''} on this node" if device.type == "cpu" else f"on {device}"
    raise UsageError(
        f"--engine {engine} needs {need / GIB:.1f} GiB for the training state of {params / 1e6:.0f}M parameters "
        f"({state_bytes / GIB:.1f} GiB per rank, {where}: weights, gradients, AdamW; activations not counted) but "
        f"{free / GIB:.1f} GiB is free",
        "shard the state with --engine fsdp (or zero1: AdamW's alone) over more ranks, train LoRA adapters "
        "(--use_peft), or use a smaller model",
    )
