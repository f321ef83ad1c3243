#!/usr/bin/env bash
# torch's CUDA (torch.version.cuda) against the CUDA toolkit's nvcc, major.minor. Horovod's CUDA kernels are
# compiled by nvcc and linked into the process where torch's CUDA runtime runs; a torch from another index
# (pip's --extra-index-url can bring PyPI's cu130 wheel next to a 12.8 toolkit) builds, then fails at run time.
#
# Usage: PYTHON=python NVCC=nvcc scripts/check_cuda_match.sh [--strict]
#   default (build_horovod.sh on any machine): another major version is an error, another minor a warning.
#   --strict (docker/Dockerfile, where both are pinned): major.minor must be equal, and a CPU torch must find
#   no nvcc (a CPU image has none).
# Exit 0, or 2 with one line "error: ...; fix: ...".
set -euo pipefail
PYTHON=${PYTHON:-python3}
NVCC=${NVCC:-nvcc}
strict=0
if [ "${1:-}" = --strict ]; then strict=1; fi

fail() {
    echo "error: $1; fix: $2" >&2
    exit 2
}

torch_cuda=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "cpu")')
nvcc_cuda=""
if command -v "$NVCC" >/dev/null 2>&1; then
    nvcc_cuda=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n 1)
fi
fix="install torch from the index of the toolkit's CUDA (e.g. --index-url https://download.pytorch.org/whl/cu${nvcc_cuda/./}), or put the matching nvcc first on PATH (NVCC)"

if [ "$torch_cuda" = cpu ]; then
    if [ "$strict" = 1 ] && [ -n "$nvcc_cuda" ]; then
        fail "torch is a CPU build but this image has the CUDA $nvcc_cuda toolkit" "$fix"
    fi
    exit 0
fi
[ -n "$nvcc_cuda" ] || fail "torch is built for CUDA $torch_cuda but there is no nvcc ($NVCC)" \
    "install the CUDA $torch_cuda toolkit or set NVCC"
if [ "$torch_cuda" = "$nvcc_cuda" ]; then
    echo "[cuda] torch and nvcc: CUDA $torch_cuda"
elif [ "$strict" = 1 ] || [ "${torch_cuda%%.*}" != "${nvcc_cuda%%.*}" ]; then
    fail "torch is built for CUDA $torch_cuda but nvcc is CUDA $nvcc_cuda" "$fix"
else
    echo "[cuda] warning: torch is built for CUDA $torch_cuda, nvcc is CUDA $nvcc_cuda (same major version)" >&2
fi
