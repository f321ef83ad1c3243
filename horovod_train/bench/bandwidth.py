"""Bandwidths as nccl-tests defines them: the algorithm's and the bus's, in GB/s (10^9 bytes)."""

from __future__ import annotations

GB = 1e9  # bandwidths in GB/s (10^9 bytes), as nccl-tests prints them


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: the bytes of the (summed) buffer over the time of the operation."""
    return nbytes / seconds / GB


def busbw(alg: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of all-reduce, 2(n-1)/n x algbw: comparable with the link's peak."""
    return alg * 2 * (world_size - 1) / world_size
