"""The tools a Horovod build needs, found or reported missing (one UsageError each, before anything is built)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from horovod_train.common.errors import UsageError

COMPILERS = ("c++", "g++", "clang++")


def search_path(bin_dir: Path) -> str:
    """PATH for finding and running build tools: the target's bin/ (pip's cmake lives there) first."""
    return os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])


def find_compiler(path: str) -> str:
    """The C++ compiler command: CXX, else the first of COMPILERS on PATH."""
    cxx = os.environ.get("CXX", "")
    if cxx.strip():
        return compiler_of_cxx(cxx, path)
    found = next(filter(None, (shutil.which(c, path=path) for c in COMPILERS)), None)
    if not found:
        raise UsageError(
            "no C++ compiler: c++, g++ or clang++ is not on PATH", "apt-get install g++ (or build-essential)"
        )
    return found


def compiler_of_cxx(cxx: str, path: str) -> str:
    """CXX is a command line ('g++ -O2', 'ccache g++'): its first word is looked up on PATH, the rest kept for CMake,
    which reads flags from CXX too."""
    try:
        program, *flags = shlex.split(cxx)
    except ValueError as error:
        raise UsageError(f"CXX={cxx!r} is not a command line ({error})", "close its quotes, or unset CXX") from None
    found = shutil.which(program, path=path)
    if not found:
        raise UsageError(f"no C++ compiler: {program} (CXX={cxx}) is not on PATH",
                         f"install {program}, or unset CXX (then c++, g++ or clang++ is used)")  # fmt: skip
    return shlex.join([found, *flags])


def find_cmake(path: str) -> str:
    found = shutil.which("cmake", path=path)
    if not found:
        raise UsageError("no cmake on PATH or next to this python", "pip install 'cmake<5' (or apt-get install cmake)")
    return found


def check_build_modules() -> None:
    """Horovod's setup.py runs without build isolation, against this environment's setuptools and wheel."""
    missing = [name for name in ("setuptools", "wheel") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"{' and '.join(missing)} not installed in this environment", f"pip install {' '.join(missing)}"
        )


def find_mpi(path: str, wanted: bool | None) -> bool:
    """Whether to build with MPI: yes when mpicxx is there; an mpirun without it means missing headers."""
    if wanted is False or (wanted is None and os.environ.get("HOROVOD_WITHOUT_MPI")):
        return False  # --with-mpi wins over the variable
    if shutil.which("mpicxx", path=path) or shutil.which("mpicc", path=path):
        return True
    if wanted or shutil.which("mpirun", path=path):
        raise UsageError(
            "MPI headers missing: no mpicxx on PATH (Horovod's MPI controller is compiled against them)",
            "apt-get install libopenmpi-dev (or build without MPI: --without-mpi)",
        )
    return False


def nvcc_release(nvcc: str) -> str | None:
    """'13.0' from `nvcc --version`."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return None
    found = re.search(r"release (\d+\.\d+)", out)
    return found[1] if found else None


def cuda_home_of_nvcc(nvcc: str) -> Path | None:
    """The toolkit root nvcc belongs to: `nvcc --dryrun` prints _HERE_, right even when nvcc is a wrapper script
    elsewhere (here /usr/local/bin/nvcc runs /usr/local/cuda-13.0/bin/nvcc; its dirname would give /usr/local)."""
    probe = [nvcc, "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"]
    try:
        out = subprocess.run(probe, capture_output=True, text=True, timeout=60).stderr
    except OSError:
        return None
    here = re.search(r"(?m)^#\$ _HERE_=(.+)$", out)
    return Path(here[1]).resolve().parent if here else Path(nvcc).resolve().parent.parent


def cuda_missing_error(torch_cuda: str, problem: str) -> UsageError:
    major = torch_cuda.split(".")[0]
    return UsageError(
        f"torch is a CUDA {torch_cuda} build but {problem} (Horovod's GPU build compiles CUDA code)",
        f"pip install nvidia-cuda-runtime-cu{major} nvidia-cuda-nvcc-cu{major}, or install the CUDA {major} toolkit "
        "and put its nvcc on PATH (or set HOROVOD_CUDA_HOME)",
    )


def pip_nvcc() -> str | None:
    """nvcc from NVIDIA's pip wheel (nvidia-cuda-nvcc-cuXX or nvidia-cuda-nvcc), if installed here."""
    import importlib.metadata as metadata

    for dist in ("nvidia-cuda-nvcc-cu13", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc"):
        try:
            files = metadata.distribution(dist).files or []
        except metadata.PackageNotFoundError:
            continue
        nvcc = next((Path(str(f.locate())) for f in files if Path(str(f)).name == "nvcc"), None)
        if nvcc and nvcc.is_file():
            return str(nvcc)
    return None


def find_cuda(torch_cuda: str, path: str) -> tuple[Path, str]:
    """(toolkit root, nvcc) for a CUDA torch; the root must hold cuda_runtime.h and nvcc torch's major version."""
    home = os.environ.get("HOROVOD_CUDA_HOME")
    nvcc = str(Path(home) / "bin" / "nvcc") if home else shutil.which("nvcc", path=path) or pip_nvcc()
    if not nvcc or not Path(nvcc).is_file():
        raise cuda_missing_error(torch_cuda, f"there is no nvcc ({nvcc or 'not on PATH'})")
    root = Path(home) if home else cuda_home_of_nvcc(nvcc)
    if root is None or not (root / "include" / "cuda_runtime.h").is_file():
        raise cuda_missing_error(torch_cuda, f"the CUDA headers are missing (no include/cuda_runtime.h in {root})")
    release = nvcc_release(nvcc)
    if release is None or release.split(".")[0] != torch_cuda.split(".")[0]:
        raise UsageError(
            f"torch is built for CUDA {torch_cuda} but {nvcc} is CUDA {release or 'unknown'}",
            f"put a CUDA {torch_cuda.split('.')[0]} nvcc first on PATH (or HOROVOD_CUDA_HOME), or install the torch "
            f"of nvcc's CUDA",
        )
    return root, nvcc
