"""Shared by the engine contract tests."""

from __future__ import annotations

LAUNCHES = {
    "horovod-gloo": ("horovod", 2),
    "horovod-mpi": ("horovod", 2),
    "ddp": ("ddp", 2),
    "zero1": ("zero1", 2),
    "fsdp": ("fsdp", 2),
    "single": ("single", 1),
    "dp": ("dp", 1),
}
