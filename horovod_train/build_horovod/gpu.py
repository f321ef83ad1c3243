"""A CUDA torch's build: the NCCL Horovod links and the GPU architectures its kernels are compiled for."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from horovod_train.build_horovod.nccl import nccl_dirs
from horovod_train.common.errors import UsageError

# Horovod compiles its kernels for every sm_XX `nvcc --help` lists, twice (two C++ ABIs): on CUDA 13.0 that is 12
# architectures, minutes on 2 cores. On CUDA >= 13 the default is the GPUs of data centres and workstations
# (Turing to Blackwell; H100/H200 are 90). HOROVOD_BUILD_CUDA_CC_LIST (Horovod's own knob) overrides it.
DEFAULT_ARCHS_CUDA13 = "75,80,86,89,90,100,120"
SYSTEM_NCCL_DIRS = ("/usr/include", "/usr/local/include", "/usr/local/cuda/include")
SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/lib", "/usr/local/cuda/lib64")


def system_nccl(cuda_home: Path) -> dict[str, str]:
    """HOROVOD_NCCL_INCLUDE/LIB for an NCCL installed in the system (libnccl-dev) or the toolkit."""
    includes = [*SYSTEM_NCCL_DIRS, str(cuda_home / "include")]
    libs = [*SYSTEM_LIB_DIRS, str(cuda_home / "lib64")]
    include = next((d for d in includes if (Path(d) / "nccl.h").is_file()), None)
    lib = next((d for d in libs if any(Path(d).glob("libnccl.so*"))), None)
    return {"HOROVOD_NCCL_INCLUDE": include, "HOROVOD_NCCL_LIB": lib} if include and lib else {}


def given_nccl() -> dict[str, str]:
    """The NCCL the user named with Horovod's own variables (HOROVOD_NCCL_HOME, or _INCLUDE + _LIB)."""
    names = ("HOROVOD_NCCL_HOME", "HOROVOD_NCCL_INCLUDE", "HOROVOD_NCCL_LIB", "HOROVOD_NCCL_LINK")
    return {name: os.environ[name] for name in names if os.environ.get(name)}


def find_nccl(prefix: Path, cuda_home: Path, wanted: bool | None, link: bool) -> tuple[dict[str, str], str]:
    """(Horovod's NCCL variables, where it was found); empty when there is none and NCCL was not asked for.

    Torch's own pip NCCL (nvidia-nccl-cuXX) comes first: the same library torch loads. ``link`` makes the
    libnccl.so link the wheel lacks (a dry run only looks)."""
    if wanted is False:
        return {}, "not used (--without-nccl)"
    if os.environ.get("HOROVOD_NCCL_HOME") or os.environ.get("HOROVOD_NCCL_LIB"):
        return given_nccl(), "given by HOROVOD_NCCL_HOME/HOROVOD_NCCL_LIB"
    link_dir = prefix / "nccl-link"
    if link:
        found = nccl_dirs(link_dir)
    else:  # a dry run writes nothing into the environment: the links go to a directory removed at once
        with tempfile.TemporaryDirectory() as scratch:
            found = nccl_dirs(Path(scratch))
        found = {**found, "HOROVOD_NCCL_LIB": str(link_dir)} if found else found
    if found:
        return found, f"pip wheel (headers {found['HOROVOD_NCCL_INCLUDE']})"
    system = system_nccl(cuda_home)
    if system:
        return system, f"system ({system['HOROVOD_NCCL_INCLUDE']}, {system['HOROVOD_NCCL_LIB']})"
    if wanted:
        raise UsageError("no NCCL found (no nvidia-nccl-cu* wheel, no nccl.h + libnccl.so in the system)",
                         "pip install nvidia-nccl-cu13 (the one matching torch's CUDA), or --without-nccl")  # fmt: skip
    return {}, "not found (no nvidia-nccl-cu* wheel, no system nccl.h): Horovod without NCCL"


def cuda_archs(nvcc: str, release: str, requested: str | None) -> str | None:
    """The architecture list (commas), checked against what this nvcc compiles for; None: Horovod's default."""
    wanted = requested or os.environ.get("HOROVOD_BUILD_CUDA_CC_LIST")
    if not wanted and int(release.split(".")[0]) >= 13:
        wanted = DEFAULT_ARCHS_CUDA13
    if not wanted:
        return None
    archs = [a for a in re.split(r"[ ,;]+", wanted) if a]
    listed = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout
    supported = re.findall(r"compute_(\d+)", listed)
    unknown = [a for a in archs if supported and a not in supported]
    if unknown:
        raise UsageError(f"CUDA architecture {', '.join(unknown)} is not one {nvcc} (CUDA {release}) compiles for",
                         f"use some of: {' '.join(supported)}")  # fmt: skip
    return ",".join(archs)
