"""scripts/build_horovod_nccl.sh, which the NCCL tests and the GPU image's fixture all run: Horovod with NCCL
against PyPI's CUDA 13 torch in its own cached environment (a cache hit after the first run on a machine)."""

from __future__ import annotations

import os
import shutil
import subprocess

from support.jobs import REPO

SCRIPT = REPO / "scripts" / "build_horovod_nccl.sh"


def have_nvcc() -> bool:
    """The script compiles CUDA code: nvcc ($NVCC, else on PATH) must be there."""
    return shutil.which(os.environ.get("NVCC", "nvcc")) is not None


def run_nccl_build(env: dict[str, str] | None = None, timeout: float = 1700) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT)], cwd=REPO, env=env or dict(os.environ), capture_output=True, text=True, timeout=timeout
    )
