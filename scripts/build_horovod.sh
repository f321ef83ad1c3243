#!/usr/bin/env bash
# Build Horovod 0.28.1 from the PyPI sdist against the torch installed in $PYTHON, and install it:
# `horovod-train build-horovod` (horovod_train/build_horovod/, the one place the build and its patches live),
# run from this checkout so that an environment with torch alone (no horovod-train installed) can use it.
# Shared by `make setup` (scripts/setup.sh) and scripts/build_horovod_nccl.sh; arguments go to the command
# (--dry-run, --force, --with-nccl/--without-nccl, --with-mpi/--without-mpi, --cuda-archs, --jobs).
#
# Horovod 0.28.1 (the last release) asks CMake for C++14, but torch >= 2.1 needs C++17, and pip's CMake 4
# rejects the CMake minimum of the bundled Gloo: the command patches the first and sets
# CMAKE_POLICY_VERSION_MINIMUM=3.5 for the second. The wheel is cached per (horovod, torch, python, cuda,
# architectures) in ~/.cache/horovod-train/wheels (HOROVOD_WHEEL_CACHE, or HOROVOD_TRAIN_CACHE/wheels).
# Knobs it reads: HOROVOD_SDIST (build offline from that sdist), HOROVOD_WITHOUT_MPI, HOROVOD_CUDA_HOME,
# HOROVOD_NCCL_HOME or HOROVOD_NCCL_INCLUDE/HOROVOD_NCCL_LIB, HOROVOD_BUILD_CUDA_CC_LIST, HOROVOD_BUILD_JOBS.
# HOROVOD_WHEEL=path/horovod-X.whl installs a wheel built before (scripts/gpu_check.sh, offline) instead.
set -euo pipefail

PYTHON=${PYTHON:-python3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Build tools in the target environment itself (make setup has them already; a fresh image does not). The command
# only says what is missing; this script, run by our own setup paths, installs it (pip honours PIP_NO_INDEX).
BIN=$(dirname "$(command -v "$PYTHON")")
if ! { { command -v cmake >/dev/null || [ -x "$BIN/cmake" ]; } && "$PYTHON" -c 'import setuptools, wheel' 2>/dev/null; }; then
    echo "[horovod] installing the build tools into $PYTHON's environment: cmake<5, setuptools, wheel"
    "$PYTHON" -m pip install 'cmake<5' setuptools wheel | sed -u '/^Requirement already satisfied/d'
fi

if [ -n "${HOROVOD_WHEEL:-}" ]; then
    echo "[horovod] installing the given wheel $HOROVOD_WHEEL"
    "$PYTHON" -m pip install -q --no-deps --force-reinstall "$HOROVOD_WHEEL"
    exit 0
fi
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m horovod_train.build_horovod "$@"
