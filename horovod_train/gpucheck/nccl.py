"""NCCL for Horovod's build (nccl_dirs, from horovod_train/build_horovod/nccl.py, where `horovod-train
build-horovod` finds it too); and this GPU's CUDA architecture. Standard library only."""

from __future__ import annotations

import subprocess

from horovod_train.build_horovod.nccl import nccl_dirs

__all__ = ["cuda_arch", "nccl_dirs"]


def cuda_arch() -> str:
    """HOROVOD_BUILD_CUDA_CC_LIST for this GPU only (e.g. 90): CUDA 13 dropped Horovod's old defaults."""
    query = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]
    try:
        cap = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        cap = []
    return cap[0].replace(".", "") if cap else "90"
