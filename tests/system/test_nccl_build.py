"""Horovod's NCCL build, for real, on a machine with nvcc (CUDA 13) and no GPU: scripts/build_horovod_nccl.sh
makes (or reuses) its own environment with PyPI's CUDA 13 torch and nvidia-nccl-cu13, builds Horovod 0.28.1 with
HOROVOD_GPU_OPERATIONS=NCCL through scripts/build_horovod.sh, and checks it. This test then looks at that
environment itself: `horovodrun --check-build` lists NCCL (with PyTorch, MPI and Gloo) and `hvd.nccl_built()`
is true. A second run must reuse everything and take seconds.

Cold (no cached environment, no cached wheel): 2.8 GB of wheels (1.5 min here) and the compile (5 min on 2 quiet
cores, 9 under load); warm: 20-25 s a run. Skipped only where there is no nvcc."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from support import builds
from support.jobs import REPO
from support.nccl import have_nvcc, run_nccl_build

LISTED = ("[X] PyTorch", "[X] MPI", "[X] Gloo", "[X] NCCL")


def output(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-6000:]}"


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.builds("nccl")
def test_horovod_builds_with_nccl_against_cuda_torch_without_a_gpu():
    if not have_nvcc():
        pytest.skip("needs nvcc (the CUDA 13 toolkit) on PATH to compile Horovod's NCCL build; there is none")
    proc = builds.result("nccl")  # begun when the session started
    assert proc is not None and proc.returncode == 0, output(proc)
    # --check-build's banner where this run built or installed Horovod; on a warm machine one line naming it.
    warm = "(PyTorch, Gloo, MPI, NCCL) already installed for" in proc.stdout
    assert warm or all(item in proc.stdout for item in LISTED), output(proc)
    found = re.search(r"^\[nccl-build\] python: (\S+)$", proc.stdout, re.MULTILINE)
    assert found, output(proc)
    python = Path(found.group(1))
    assert python.parent.parent != REPO / ".venv", "the NCCL build must not touch .venv (CPU torch)"

    # The environment the script left, checked on its own.
    check = subprocess.run(
        [str(python.parent / "horovodrun"), "--check-build"], capture_output=True, text=True, timeout=300
    )
    assert check.returncode == 0, check.stdout + check.stderr
    for item in LISTED:
        assert item in check.stdout, check.stdout
    probe = (
        "import torch, horovod.torch as hvd\n"
        "print(torch.version.cuda, hvd.nccl_built(), hvd.mpi_built(), hvd.gloo_built(), torch.cuda.nccl.version())"
    )
    found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=300)
    assert found.returncode == 0, found.stdout + found.stderr
    cuda, nccl_built, mpi_built, gloo_built, *_ = found.stdout.split()
    assert cuda.startswith("13."), found.stdout  # PyPI's CUDA 13 wheel, not a local CPU torch
    assert int(nccl_built) >= 20000, found.stdout  # hvd.nccl_built() is NCCL's version code, e.g. 22907
    assert mpi_built == "True" and gloo_built == "True", found.stdout

    # Everything is cached now: the same command again reuses the environment and the installed Horovod.
    start = time.monotonic()
    again = run_nccl_build(timeout=600)
    seconds = time.monotonic() - start
    assert again.returncode == 0, output(again)
    assert "[nccl-build] reusing" in again.stdout, output(again)
    assert "(PyTorch, Gloo, MPI, NCCL) already installed for" in again.stdout, output(again)
    assert seconds < 120, f"a warm run took {seconds:.0f} s\n{output(again)}"


def test_no_nvcc_is_one_line_and_exit_2():
    env = {**os.environ, "NVCC": "/nonexistent/cuda-13/bin/nvcc"}
    proc = run_nccl_build(env, timeout=60)
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no nvcc:") and "; fix: " in lines[0], output(proc)
    assert proc.stdout == "", output(proc)
