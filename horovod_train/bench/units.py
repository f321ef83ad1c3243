"""Byte sizes as the benchmarks read and print them: binary units, as nccl-tests' -b/-e sizes."""

from __future__ import annotations

import re

from horovod_train.common.errors import UsageError

UNITS = {
    "": 1,
    "B": 1,
    "K": 2**10,
    "KB": 2**10,
    "KIB": 2**10,
    "M": 2**20,
    "MB": 2**20,
    "MIB": 2**20,
    "G": 2**30,
    "GB": 2**30,
    "GIB": 2**30,
}  # binary, as nccl-tests' -b/-e sizes


def parse_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match[2].upper() if match else None
    if not match or unit not in UNITS:
        raise UsageError(f"cannot read {text!r} as a size in bytes", "write e.g. 4KB, 64MB or 1GB")
    return int(float(match[1]) * UNITS[unit])


def format_bytes(n: float) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= size:
            return f"{n / size:.4g}{unit}"
    return f"{n:.0f}B"
