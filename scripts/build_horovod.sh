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
# passed through to Horovod's CMake, else it is torch's own pip NCCL (gpucheck/nccl.py); torch's CUDA must be
# nvcc's (scripts/check_cuda_match.sh). HOROVOD_WITHOUT_MPI=1 builds without MPI (a node with no mpicxx).
# GPU builds: the CUDA toolkit is the one `nvcc` belongs to (HOROVOD_CUDA_HOME overrides), and on CUDA >= 13
# the kernels are compiled for HOROVOD_BUILD_CUDA_CC_LIST (default 75,80,86,89,90,100,120). Without a GPU
# too: scripts/build_horovod_nccl.sh (`make nccl-build`) builds and checks the NCCL variant on CUDA 13.
set -euo pipefail

PYTHON=${PYTHON:-python3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
CACHE_DIR=${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/horovod-train/wheels}

# The GPU build is chosen from what torch was built with, not from whether nvcc exists:
# a CPU torch next to an nvcc must still give a CPU Horovod.
read -r TORCH_VERSION TORCH_CUDA PYTAG < <("$PYTHON" - <<'PY'
import sys, torch
print(torch.__version__.replace("+", "_"), torch.version.cuda or "cpu", f"cp{sys.version_info[0]}{sys.version_info[1]}")
PY
)

if [ "$TORCH_CUDA" != "cpu" ]; then
    # Horovod's CMake (its bundled FindCUDAToolkit) and torch's cpp_extension (CUDA_HOME, where Horovod's
    # CMake looks for libcudart) take the toolkit's root from the directory `nvcc` is found in. An nvcc that
    # is a wrapper script elsewhere (here: /usr/local/bin/nvcc runs /usr/local/cuda-13.0/bin/nvcc) makes that
    # /usr/local, and configuring fails ("Could NOT find CUDAToolkit (missing: CUDAToolkit_INCLUDE_DIR
    # CUDA_CUDART)", then "FOUND_LIB_cudart NOTFOUND"). nvcc says where it really is: --dryrun prints _HERE_.
    if [ -z "${HOROVOD_CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
        nvcc_here=$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -n 1)
        if [ -n "$nvcc_here" ] && [ -f "$nvcc_here/../include/cuda_runtime.h" ]; then
            HOROVOD_CUDA_HOME=$(cd "$nvcc_here/.." && pwd)
            export HOROVOD_CUDA_HOME
        fi
    fi
    if [ -n "${HOROVOD_CUDA_HOME:-}" ]; then
        export CUDA_HOME=${CUDA_HOME:-$HOROVOD_CUDA_HOME}
        NVCC=$HOROVOD_CUDA_HOME/bin/nvcc
    else
        NVCC=nvcc
    fi
    # torch's CUDA against nvcc's: another major version is an error (exit 2), another minor a warning.
    NVCC=$NVCC PYTHON=$PYTHON bash "$(dirname "${BASH_SOURCE[0]}")/check_cuda_match.sh"
    # NCCL: unless HOROVOD_NCCL_HOME/HOROVOD_NCCL_LIB name one, the pip wheel torch itself loads (nvidia-nccl-cuXX,
    # a dependency of every CUDA torch), found and linked by gpucheck/nccl.py as the GPU check does: the
    # same NCCL as torch's, never a system libnccl built for another CUDA.
    if [ -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_LIB:-}" ] && [ -f "$ROOT/horovod_train/gpucheck/nccl.py" ]; then
        nccl_env=$(PYTHONPATH="$ROOT" "$PYTHON" - "$("$PYTHON" -c 'import sys; print(sys.prefix)')/nccl-link" <<'PY'
import shlex, sys
from pathlib import Path
from horovod_train.gpucheck.nccl import nccl_dirs
print("".join(f"export {key}={shlex.quote(value)}\n" for key, value in nccl_dirs(Path(sys.argv[1])).items()))
PY
)
        eval "$nccl_env"
    fi
    # Horovod compiles its CUDA kernels for every sm_XX that `nvcc --help` lists, twice (two C++ ABIs): on
    # CUDA 13.0 that is 12 architectures (75..121), 1 min of compiling on 2 cores. It never asks for one that
    # nvcc lacks (CUDA 13 dropped sm_50..sm_72), so nothing breaks; on CUDA >= 13 the default is the GPUs in
    # data centres and workstations (Turing to Blackwell; H100/H200 are 90), plus PTX of the last for newer
    # ones. HOROVOD_BUILD_CUDA_CC_LIST (Horovod's own knob, read by its cmake/build_utils.py; commas) overrides
    # it on any CUDA. Each entry must be an architecture this nvcc compiles for.
    if nvcc_release=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p') \
        && [ -n "$nvcc_release" ]; then
        if [ -z "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ] && [ "$nvcc_release" -ge 13 ]; then
            HOROVOD_BUILD_CUDA_CC_LIST=75,80,86,89,90,100,120
        fi
        if [ -n "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ]; then
            HOROVOD_BUILD_CUDA_CC_LIST=$(tr ' ;' ',,' <<<"$HOROVOD_BUILD_CUDA_CC_LIST" | tr -s ',' | sed 's/^,//; s/,$//')
            export HOROVOD_BUILD_CUDA_CC_LIST
            supported=" $("$NVCC" --list-gpu-arch 2>/dev/null | sed -n 's/^compute_//p' | tr '\n' ' ')" || supported=" "
            for cc in ${HOROVOD_BUILD_CUDA_CC_LIST//,/ }; do
                if [ "$supported" != " " ] && [[ "$supported" != *" $cc "* ]]; then
                    echo "error: HOROVOD_BUILD_CUDA_CC_LIST has $cc, which $NVCC (CUDA $nvcc_release) does not compile for; fix: use some of:$supported" >&2
                    exit 2
                fi
            done
        fi
    fi
fi

KEY="horovod-${HOROVOD_VERSION}-torch${TORCH_VERSION}-cuda${TORCH_CUDA}-${PYTAG}"
if [ "$TORCH_CUDA" != "cpu" ] && [ -n "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ]; then
    KEY="$KEY-sm${HOROVOD_BUILD_CUDA_CC_LIST//,/_}"  # another architecture list is another wheel
fi
# What was installed last is recorded next to the environment; a GPU build for other architectures is redone.
MARK=$("$PYTHON" -c 'import sys; print(sys.prefix)')/.horovod-build-key
if [ "$TORCH_CUDA" != "cpu" ] && [ -n "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ] && [ -f "$MARK" ]; then
    WANT_KEY=$KEY
else
    WANT_KEY=any
fi
if "$PYTHON" - "$HOROVOD_VERSION" "$MARK" "$WANT_KEY" <<'PY' 2>/dev/null; then
import sys, torch, horovod, horovod.torch as hvd  # the extension must load, not just the package
version, mark, want = sys.argv[1:]
same_build = want == "any" or open(mark).read().strip() == want
# a CUDA torch needs a Horovod built with NCCL: a CPU-only build is rebuilt
sys.exit(0 if horovod.__version__ == version and (not torch.version.cuda or hvd.nccl_built()) and same_build else 1)
PY
    echo "[horovod] $HOROVOD_VERSION already installed"
    exit 0
fi

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
    (cd "$WORK/dist" && sha256sum horovod-*.whl >"$WHEEL_DIR/SHA256SUMS")  # checked before every install
    mv "$WHEEL_DIR/.tmp.whl.part" "$WHEEL_DIR/$(basename "$WORK"/dist/horovod-*.whl)"
else
    echo "[horovod] using cached wheel in $WHEEL_DIR"
fi
# The digest recorded when the wheel was built (scripts/podman_build.sh copies both into an image build's cache).
if [ -f "$WHEEL_DIR/SHA256SUMS" ] && ! (cd "$WHEEL_DIR" && sha256sum --quiet --strict -c SHA256SUMS); then
    echo "error: the Horovod wheel in $WHEEL_DIR does not match the SHA256SUMS recorded when it was built;" \
        "fix: remove $WHEEL_DIR to build it again" >&2
    exit 2
fi
"$PYTHON" -m pip install -q --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
{ echo "$KEY" >"$MARK"; } 2>/dev/null || true  # a read-only prefix keeps no record
# horovod's own runtime dependencies (cloudpickle, psutil, pyyaml, packaging) are in requirements.txt.
