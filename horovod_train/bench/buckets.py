"""DDP's gradient buckets, formed by DDP's own assignment (``torch.distributed._compute_bucket_assignment_by_size``,
the function DistributedDataParallel's reducer calls) over byte-sized stand-ins on the meta device: bench allreduce
reduces them, bench project times them, and tests/integration/test_ddp_buckets.py holds them against the buckets a
real DDP rebuilds."""

from __future__ import annotations

from collections.abc import Sequence

# DistributedDataParallel's caps: bucket_cap_mb (25 MiB unless given), and only when it is not given is the first
# bucket (the last layers' gradients) capped at 1 MiB. The ddp engine always passes its --ddp_bucket_cap_mb, so its
# buckets all have the one cap.
DDP_DEFAULT_CAP_MB, DDP_DEFAULT_FIRST_BUCKET_BYTES = 25, 2**20


def ddp_caps(bucket_cap_mb: float | None) -> tuple[int, int]:
    """(cap, first bucket's cap) in bytes of ``DistributedDataParallel(bucket_cap_mb=...)``."""
    if bucket_cap_mb is None:
        return DDP_DEFAULT_CAP_MB * 2**20, DDP_DEFAULT_FIRST_BUCKET_BYTES
    return int(bucket_cap_mb * 2**20), int(bucket_cap_mb * 2**20)


def ddp_buckets(tensor_bytes: Sequence[int], bucket_cap_mb: float | None) -> list[tuple[int, int]]:
    """Over tensors of ``tensor_bytes`` (in parameter order), a list of (position in backward order of the gradient
    that completes the bucket, bytes). Backward makes the gradients in reverse order, which is the order DDP
    assigns them in; a bucket is closed once it holds its cap or more (``ddp_caps``)."""
    import torch
    import torch.distributed as dist

    backward = list(reversed(tensor_bytes))
    stand_ins = [torch.empty(n, dtype=torch.uint8, device="meta") for n in backward]  # n bytes each, no memory
    cap, first = ddp_caps(bucket_cap_mb)
    assigned, _ = dist._compute_bucket_assignment_by_size(stand_ins, [first, cap])
    return [(max(bucket), sum(backward[i] for i in bucket)) for bucket in assigned]
