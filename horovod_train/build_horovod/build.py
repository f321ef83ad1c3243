"""The build itself: Horovod's sdist, patched for torch >= 2.1, compiled into a wheel, cached, installed, checked."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from horovod_train.build_horovod.plan import Options, Plan
from horovod_train.build_horovod.progress import stage
from horovod_train.common.console import write_line
from horovod_train.common.digest import sha256

# Horovod 0.28.1 asks CMake for C++14; torch >= 2.1 needs C++17 (horovod/horovod #3996, #4014, never released).
CXX_PATCH = ("set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)")
PATCHED_FILES = ("CMakeLists.txt", "horovod/torch/CMakeLists.txt")
# Horovod's setup.py always builds RelWithDebInfo (-O3 -g). Release is the same -O3 without the debug information
# (GCC's -g does not change the code it generates): on 2 cores 247 CPU-seconds instead of 345 and a wheel of 1.1 MB
# instead of 20 (its library 65 MB with the DWARF sections). --debug-info keeps Horovod's build, for gdb.
BUILD_TYPE_PATCH = ("else 'RelWithDebInfo'", "else 'Release'")
# GCC 13's libstdc++ no longer includes these through other headers, and Horovod 0.28.1's sources lean on that
# (group_table.h uses std::string, common.h std::logic_error without including them): seen on the GPU nodes' GCC
# 13.3. Included first in every C++ file (CMake takes CXXFLAGS as its CMAKE_CXX_FLAGS); harmless on older GCCs.
FORCED_INCLUDES = ("string", "stdexcept", "cstdint", "limits")
SUMS = "SHA256SUMS"  # sha256sum's format, written when the wheel is built and checked before every install
MARK = ".horovod-build-key"  # in sys.prefix: the key of the Horovod installed there


# Set from the plan alone: a value left in the caller's environment must not contradict it.
CHOSEN_HERE = ("HOROVOD_GPU_OPERATIONS", "HOROVOD_GPU_ALLREDUCE", "HOROVOD_GPU_BROADCAST", "HOROVOD_WITH_MPI",
               "HOROVOD_WITHOUT_MPI")  # fmt: skip


def build_env(plan: Plan, options: Options) -> dict[str, str]:
    """Horovod's setup.py options. CMAKE_POLICY_VERSION_MINIMUM: pip's CMake 4 rejects bundled Gloo's minimum."""
    env = {k: v for k, v in os.environ.items() if k not in CHOSEN_HERE}
    env |= {
        "HOROVOD_WITH_PYTORCH": "1",
        "HOROVOD_WITHOUT_TENSORFLOW": "1",
        "HOROVOD_WITHOUT_MXNET": "1",
        "HOROVOD_WITH_GLOO": "1",
        "CMAKE_POLICY_VERSION_MINIMUM": "3.5",
        "MAKEFLAGS": f"-j{options.jobs or os.environ.get('HOROVOD_BUILD_JOBS') or os.cpu_count() or 1}",
        "PATH": os.pathsep.join([str(plan.target.bin_dir), os.environ.get("PATH", "")]),
        "CXX": plan.compiler,
        "CXXFLAGS": " ".join([*(f"-include {h}" for h in FORCED_INCLUDES), os.environ.get("CXXFLAGS", "")]).strip(),
    }
    env |= {"HOROVOD_WITH_MPI": "1"} if plan.mpi else {"HOROVOD_WITHOUT_MPI": "1"}
    if plan.cuda_home:  # Horovod's CMake and torch's cpp_extension take the toolkit from here
        env |= {"HOROVOD_CUDA_HOME": str(plan.cuda_home), "CUDA_HOME": str(plan.cuda_home)}
        env["PATH"] = os.pathsep.join([str(plan.cuda_home / "bin"), env["PATH"]])
    if plan.cuda_archs:
        env["HOROVOD_BUILD_CUDA_CC_LIST"] = plan.cuda_archs
    if plan.nccl:
        env |= plan.nccl_env | {"HOROVOD_GPU_OPERATIONS": "NCCL"}
    return env


def patch_sources(src: Path, debug_info: bool = False) -> None:
    for name in PATCHED_FILES:
        patch_file(src / name, CXX_PATCH, "sets no CMAKE_CXX_STANDARD 14")
    if not debug_info:
        patch_file(src / "setup.py", BUILD_TYPE_PATCH, "chooses no RelWithDebInfo build")


def patch_file(path: Path, patch: tuple[str, str], lacking: str) -> None:
    """``patch``'s first text replaced by its second; a file patched before (a HOROVOD_SDIST made from patched
    sources) stays as it is, one with neither is refused."""
    text = path.read_text()
    if patch[0] not in text and patch[1] not in text:
        raise RuntimeError(f"{path} {lacking} to patch: not Horovod 0.28.1's sources?")
    path.write_text(text.replace(*patch))


def fetch_sources(plan: Plan, work: Path) -> Path:
    """The sdist (HOROVOD_SDIST, offline; else pip download), unpacked and patched."""
    sdist = os.environ.get("HOROVOD_SDIST")
    if not sdist:
        pip = [plan.target.python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*pip, "-d", str(work), f"horovod=={plan.version}"], check=True)
        sdist = str(next(work.glob(f"horovod-{plan.version}.tar.gz")))
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(work, filter="data")
        else:  # Python < 3.10.12 has no extraction filters
            tar.extractall(work)  # noqa: S202
    src = work / f"horovod-{plan.version}"
    patch_sources(src, plan.debug_info)
    return src


def build_wheel(plan: Plan, options: Options) -> None:
    """Compiled without build isolation (against the torch that will import it), then cached with its digest."""
    what = f"building {plan.key} (several minutes; cached in {plan.wheel_dir})"
    with stage(what), tempfile.TemporaryDirectory(prefix="hvt-horovod-build-") as tmp:
        work = Path(tmp)
        src = fetch_sources(plan, work)
        pip = [plan.target.python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        subprocess.run([*pip, "-w", str(work / "dist"), str(src)], env=build_env(plan, options), check=True)
        (wheel,) = (work / "dist").glob("horovod-*.whl")
        store_wheel(wheel, plan.wheel_dir)


@contextlib.contextmanager
def cache_lock(plan: Plan) -> Iterator[None]:
    """One process at a time finds, builds, stores and installs a key's wheel (two checkouts' `make setup` on one
    machine): the second waits, then installs the first's wheel instead of building it again into the same files."""
    plan.wheel_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(plan.wheel_dir.parent / f".{plan.key}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            write_line(f"[horovod] waiting for another build-horovod of {plan.key} on this machine")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def store_wheel(wheel: Path, wheel_dir: Path) -> None:
    """Into the cache whole or not at all: copied under a temporary name, the digest written, then renamed."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for old in wheel_dir.glob("horovod-*.whl"):
        old.unlink()
    partial = wheel_dir / ".tmp.whl.part"
    shutil.copyfile(wheel, partial)
    (wheel_dir / SUMS).write_text(f"{sha256(partial)}  {wheel.name}\n")
    partial.rename(wheel_dir / wheel.name)
