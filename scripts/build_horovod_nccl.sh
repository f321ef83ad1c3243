#!/usr/bin/env bash
# Horovod 0.28.1 with NCCL, built and checked on a machine with the CUDA 13 toolkit (nvcc) and no GPU
# (`make nccl-build`; tests/system/test_nccl_build.py runs it on every `make test`).
#
# In an environment of its own, never .venv (which keeps the CPU torch): the CUDA 13.0 build of torch from
# PyPI (torch==$HVT_NCCL_TORCH, default requirements.txt's pin; PyPI's default wheel is the cu130 one),
# NVIDIA's NCCL wheel (nvidia-nccl-cu13, torch's own dependency: nccl.h + libnccl.so.2), the build tools and
# Horovod's runtime dependencies; then `horovod-train build-horovod --with-nccl --with-mpi` through
# scripts/build_horovod.sh (PyTorch, Gloo, MPI and NCCL must be listed by --check-build), and
# `import horovod.torch` with hvd.nccl_built(). torch imports without a GPU; nothing here needs one.
#
# Cached per machine: the environment in ~/.cache/horovod-train/venv-nccl-<torch>-<python> (HVT_NCCL_VENV),
# trusted only once its completion stamp is written (a killed run is redone), and the Horovod wheel in
# build_horovod.sh's cache (per horovod, torch, CUDA, python, architectures). A second run takes seconds.
#
# pip talks to PyPI only (HVT_NCCL_INDEX_URL overrides): the machine's pip configuration (find-links with a
# CPU torch, constraints, extra indexes) is ignored, so the CUDA wheel cannot be swapped for a local one.
# Knobs: NVCC (the nvcc to use), BASE_PYTHON, HOROVOD_BUILD_CUDA_CC_LIST, HOROVOD_BUILD_JOBS.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
START=$SECONDS

fail() {  # one line, exit 2: a problem with this machine, not with the build
    echo "error: $1; fix: $2" >&2
    exit 2
}

NVCC=${NVCC:-nvcc}
if ! command -v "$NVCC" >/dev/null 2>&1; then
    fail "no nvcc: '$NVCC' is not an executable on PATH (Horovod's NCCL build compiles CUDA kernels)" \
        "install the CUDA 13 toolkit (its nvcc) and put its bin/ on PATH, or set NVCC=/path/to/cuda-13/bin/nvcc"
fi
NVCC=$(command -v "$NVCC")
CUDA_RELEASE=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\),.*/\1/p' | head -n 1)
if [ "${CUDA_RELEASE%%.*}" != 13 ]; then
    fail "$NVCC is CUDA ${CUDA_RELEASE:-unknown}, but torch's and NCCL's PyPI wheels used here are built for CUDA 13" \
        "put a CUDA 13.x nvcc first on PATH (or set NVCC)"
fi
# The toolkit's root (nvcc may be a wrapper script elsewhere: see scripts/build_horovod.sh).
NVCC_HERE=$("$NVCC" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -n 1)
CUDA_ROOT=${HOROVOD_CUDA_HOME:-$(cd "${NVCC_HERE:-$(dirname "$NVCC")}/.." && pwd)}
if [ ! -f "$CUDA_ROOT/include/cuda_runtime.h" ]; then
    fail "no include/cuda_runtime.h in $CUDA_ROOT, the CUDA toolkit $NVCC belongs to" \
        "install the full CUDA 13 toolkit (cudart headers), or set HOROVOD_CUDA_HOME to its root"
fi
export HOROVOD_CUDA_HOME=$CUDA_ROOT

bash scripts/install_mpi.sh  # Horovod is built with MPI too (and Gloo): the MPI controller must be listed

BASE_PYTHON=${BASE_PYTHON:-python3}
if ! command -v "$BASE_PYTHON" >/dev/null 2>&1 || ! "$BASE_PYTHON" -c 'import venv' 2>/dev/null; then
    fail "no python with venv at $BASE_PYTHON" "install python3 with its venv module, or set BASE_PYTHON"
fi
TORCH=${HVT_NCCL_TORCH:-$(sed -n 's/^torch==\([^ ;#]*\).*/\1/p' requirements.txt)}
if [ -z "$TORCH" ]; then
    fail "no torch version: requirements.txt pins none and HVT_NCCL_TORCH is unset" "set HVT_NCCL_TORCH=2.13.0"
fi
PYTAG=$("$BASE_PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/horovod-train
VENV=${HVT_NCCL_VENV:-$CACHE/venv-nccl-$TORCH-$PYTAG}
INDEX_URL=${HVT_NCCL_INDEX_URL:-https://pypi.org/simple}
PY=$VENV/bin/python

# What the environment holds; another value (another torch, another package list) rebuilds it.
# numpy: torch warns at every import without it.
PACKAGES=("torch==$TORCH" "cmake<5" setuptools wheel cloudpickle psutil pyyaml packaging numpy)
WANT="index=$INDEX_URL ${PACKAGES[*]}"
STAMP=$VENV/.hvt-nccl-complete

# PyPI only: none of this machine's pip configuration (find-links, constraints capping torch, extra indexes)
# applies, here and in scripts/build_horovod.sh (the Horovod sdist).
export PIP_CONFIG_FILE=/dev/null PIP_INDEX_URL=$INDEX_URL PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_CONSTRAINT PIP_NO_INDEX PIP_REQUIRE_VIRTUALENV

if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ] && [ -n "$(ls -A "$VENV")" ]; then
    fail "$VENV exists and is not a virtual environment (this script replaces it when it is stale)" \
        "set HVT_NCCL_VENV to a new directory"
fi
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"  # two runs at once (make nccl-build and the test): the second waits for the first
flock 9

torch_info() { "$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null; }
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && info=$(torch_info); then
    echo "[nccl-build] reusing $VENV"
else
    echo "[nccl-build] creating $VENV: torch==$TORCH (CUDA build) and its NVIDIA wheels from $INDEX_URL (about 3 GB)"
    rm -rf "$VENV"
    "$BASE_PYTHON" -m venv "$VENV"
    # --no-cache-dir: the 3 GB of wheels would otherwise be kept twice (pip's cache and the environment).
    "$PY" -m pip install -q --no-cache-dir --upgrade pip
    "$PY" -m pip install -q --no-cache-dir --index-url "$INDEX_URL" "${PACKAGES[@]}"
    # NCCL normally comes with torch (pinned to the version torch was built with); a torch without it gets one.
    if ! "$PY" -c 'import importlib.metadata as m; m.version("nvidia-nccl-cu13")' 2>/dev/null; then
        "$PY" -m pip install -q --no-cache-dir --index-url "$INDEX_URL" nvidia-nccl-cu13
    fi
    if ! info=$(torch_info); then
        echo "error: torch does not import in $PY ($("$PY" -c 'import torch' 2>&1 | tail -n 1)); fix: rm -rf $VENV and rerun" >&2
        exit 1
    fi
    echo "$WANT" >"$STAMP"  # last: an environment without it is rebuilt, never trusted
    echo "[nccl-build] environment ready after $((SECONDS - START)) s"
fi

# torch must be the CUDA 13 build, and must import on a machine without a GPU.
read -r TORCH_FOUND TORCH_CUDA <<<"$info"
if [ "${TORCH_CUDA%%.*}" != "${CUDA_RELEASE%%.*}" ]; then
    echo "error: $PY has torch $TORCH_FOUND built for CUDA $TORCH_CUDA, not CUDA ${CUDA_RELEASE%%.*} like $NVCC; fix: set HVT_NCCL_TORCH to a torch whose PyPI wheel is a CUDA ${CUDA_RELEASE%%.*} build (rm -rf $VENV)" >&2
    exit 1
fi

# Horovod through `horovod-train build-horovod` (scripts/build_horovod.sh runs it from this checkout): NCCL from
# torch's own wheel (nvidia-nccl-cu13, linked by gpucheck/nccl.py), MPI and Gloo; when it builds or installs Horovod
# it prints --check-build and fails unless PyTorch, Gloo, MPI and NCCL are listed (else one line: already installed).
BUILD_START=$SECONDS
# HOROVOD_NCCL_*= : always the NCCL wheel torch loads here, never one a variable names for another CUDA.
HOROVOD_NCCL_HOME='' HOROVOD_NCCL_LIB='' PYTHON="$PY" PATH="$VENV/bin:$PATH" bash scripts/build_horovod.sh --with-nccl --with-mpi
echo "[nccl-build] Horovod ready after $((SECONDS - BUILD_START)) s more"
read -r NCCL_BUILT NCCL_VERSION GPU < <("$PY" - <<'PY'
import torch, horovod.torch as hvd
print(hvd.nccl_built(), ".".join(map(str, torch.cuda.nccl.version())), torch.cuda.is_available())
PY
)
if [ "${NCCL_BUILT:-0}" = 0 ] || [ "$NCCL_BUILT" = False ]; then
    echo "error: hvd.nccl_built() is ${NCCL_BUILT:-not known} in $PY; fix: rm -rf $VENV and the NCCL wheel in $CACHE/wheels, then rerun" >&2
    exit 1
fi
echo "[nccl-build] torch $TORCH_FOUND, torch.version.cuda $TORCH_CUDA, GPU visible: $GPU"
echo "[nccl-build] nvcc $CUDA_RELEASE ($CUDA_ROOT), NCCL $NCCL_VERSION (hvd.nccl_built() = $NCCL_BUILT)"
echo "[nccl-build] python: $PY"
echo "[nccl-build] done in $((SECONDS - START)) s"
