#!/usr/bin/env bash
# Build Horovod 0.28.1 from the PyPI sdist against the torch installed in $PYTHON, and install it.
# Shared by `make setup` and docker/Dockerfile.
#
# Horovod 0.28.1 (the last release) asks CMake for C++14, but torch >= 2.1 needs C++17, and pip's
# CMake 4 rejects the CMake minimum of the bundled Gloo. We patch the first and set
# CMAKE_POLICY_VERSION_MINIMUM for the second. The wheel is cached per (horovod, torch, python,
# cuda) so a machine builds it once.
#
# Offline (scripts/gpu_check.sh on a GPU node with no network): HOROVOD_SDIST=path/horovod-X.tar.gz builds
# from that sdist instead of downloading it; HOROVOD_WHEEL=path/horovod-X.whl installs a wheel built
# before; build tools already present are not reinstalled (pip honours PIP_NO_INDEX/PIP_FIND_LINKS).
# NCCL is found through HOROVOD_NCCL_HOME or HOROVOD_NCCL_INCLUDE/HOROVOD_NCCL_LIB (+ HOROVOD_NCCL_LINK),
# passed through to Horovod's CMake; HOROVOD_WITHOUT_MPI=1 builds without MPI (a node with no mpicxx).
set -euo pipefail

PYTHON=${PYTHON:-python3}
HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
CACHE_DIR=${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/horovod-train/wheels}

# The GPU build is chosen from what torch was built with, not from whether nvcc exists:
# a CPU torch next to an nvcc must still give a CPU Horovod.
read -r TORCH_VERSION TORCH_CUDA PYTAG < <("$PYTHON" - <<'PY'
import sys, torch
print(torch.__version__.replace("+", "_"), torch.version.cuda or "cpu", f"cp{sys.version_info[0]}{sys.version_info[1]}")
PY
)

if "$PYTHON" - "$HOROVOD_VERSION" <<'PY' 2>/dev/null; then
import sys, torch, horovod, horovod.torch as hvd  # the extension must load, not just the package
# a CUDA torch needs a Horovod built with NCCL: a CPU-only build is rebuilt
sys.exit(0 if horovod.__version__ == sys.argv[1] and (not torch.version.cuda or hvd.nccl_built()) else 1)
PY
    echo "[horovod] $HOROVOD_VERSION already installed"
    exit 0
fi

KEY="horovod-${HOROVOD_VERSION}-torch${TORCH_VERSION}-cuda${TORCH_CUDA}-${PYTAG}"
WHEEL_DIR="$CACHE_DIR/$KEY"
if [ -n "${HOROVOD_WHEEL:-}" ]; then
    echo "[horovod] installing the given wheel $HOROVOD_WHEEL"
    WHEEL_DIR=$(mktemp -d)
    cp "$HOROVOD_WHEEL" "$WHEEL_DIR/"
elif ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    echo "[horovod] building $KEY (takes several minutes; cached in $WHEEL_DIR)"
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    export HOROVOD_WITH_GLOO=1
    if [ -z "${HOROVOD_WITHOUT_MPI:-}" ]; then export HOROVOD_WITH_MPI=1; fi
    export CMAKE_POLICY_VERSION_MINIMUM=3.5
    if [ "$TORCH_CUDA" != "cpu" ]; then
        export HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS:-NCCL}
    else
        unset HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_BROADCAST
    fi
    export MAKEFLAGS="-j${HOROVOD_BUILD_JOBS:-$(nproc)}"
    # Build tools in the target environment itself (make setup has them already; a fresh image does not).
    if ! { command -v cmake >/dev/null && "$PYTHON" -c 'import setuptools, wheel' 2>/dev/null; }; then
        "$PYTHON" -m pip install -q 'cmake<5' setuptools wheel
    fi
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    if [ -n "${HOROVOD_SDIST:-}" ]; then
        cp "$HOROVOD_SDIST" "$WORK/horovod-$HOROVOD_VERSION.tar.gz"
    else
        "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$WORK" "horovod==$HOROVOD_VERSION"
    fi
    tar -xzf "$WORK"/horovod-"$HOROVOD_VERSION".tar.gz -C "$WORK"
    SRC="$WORK/horovod-$HOROVOD_VERSION"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 17' "$SRC/horovod/torch/CMakeLists.txt"
    # No build isolation: the extension must be compiled against the torch that will import it.
    "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$SRC"
    mkdir -p "$WHEEL_DIR"
    cp "$WORK"/dist/horovod-*.whl "$WHEEL_DIR/.tmp.whl.part"
    mv "$WHEEL_DIR/.tmp.whl.part" "$WHEEL_DIR/$(basename "$WORK"/dist/horovod-*.whl)"
else
    echo "[horovod] using cached wheel in $WHEEL_DIR"
fi
"$PYTHON" -m pip install -q --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
# horovod's own runtime dependencies (cloudpickle, psutil, pyyaml, packaging) are in requirements.txt.
