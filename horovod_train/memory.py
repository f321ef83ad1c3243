"""Peak memory of this process, the same way for every engine."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated on ``device``, or the process's peak resident set size on CPU (MiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max_rss / 2**20 if sys.platform == "darwin" else max_rss / 2**10  # bytes on macOS, KiB on Linux
