#!/usr/bin/env bash
# The CUDA toolkit (nvcc, its compiler parts, the runtime headers and libcudart) for Horovod's CUDA kernels,
# from PyPI, into the image's venv: the same NVIDIA wheels torch already depends on, at the version torch pins
# (its `cuda-toolkit` dependency, e.g. 13.0.3), so nvcc's CUDA is torch's. They unpack into
# site-packages/nvidia/cuXX/{bin,include,lib,nvvm}; this makes that directory a toolkit root that CMake and
# torch's cpp_extension accept (lib64, libcudart.so, targets/<arch>-linux), linked at /usr/local/cuda.
#
# Usage (docker/Dockerfile, after torch): PYTHON=/opt/venv/bin/python docker/cuda_toolkit.sh MODE
#   MODE auto: only when torch is a CUDA build and no nvcc is on PATH (a Debian base; an nvidia/cuda base has one)
#        pypi: always;  base: never (the base image's toolkit, or none for a CPU image)
set -euo pipefail
PYTHON=${PYTHON:-python3}
MODE=${1:-auto}

fail() {
    echo "error: $1; fix: $2" >&2
    exit 2
}

case $MODE in
auto | pypi | base) ;;
*) fail "CUDA_TOOLKIT=$MODE is not auto, pypi or base" "pass --build-arg CUDA_TOOLKIT=auto" ;;
esac
torch_cuda=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "cpu")')
if [ "$MODE" = base ] || { [ "$MODE" = auto ] && { [ "$torch_cuda" = cpu ] || command -v nvcc >/dev/null; }; }; then
    echo "[cuda] toolkit from PyPI: not needed (CUDA_TOOLKIT=$MODE, torch CUDA $torch_cuda)"
    exit 0
fi
[ "$torch_cuda" != cpu ] || fail "CUDA_TOOLKIT=pypi with a CPU torch" "install a CUDA torch (TORCH_INDEX_URL)"

# torch's pin of the cuda-toolkit metapackage: its extras add the compiler at exactly that release.
toolkit=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("cuda-toolkit"))' 2>/dev/null) ||
    fail "torch $torch_cuda does not depend on the cuda-toolkit wheels (a CUDA 12 torch from download.pytorch.org)" \
        "use an nvidia/cuda devel BASE_IMAGE, or torch from PyPI (CUDA 13)"
"$PYTHON" -m pip install --no-cache-dir "cuda-toolkit[nvcc,crt,nvvm,cccl,cudart,culibos]==$toolkit"

root=$("$PYTHON" - "$torch_cuda" <<'PY'
import sys
from pathlib import Path
import nvidia  # a namespace package: the wheels' common top directory
major = sys.argv[1].split(".")[0]
print(next(Path(p) / f"cu{major}" for p in nvidia.__path__ if (Path(p) / f"cu{major}" / "bin" / "nvcc").is_file()))
PY
)
[ -f "$root/include/cuda_runtime.h" ] || fail "no include/cuda_runtime.h in $root" "add the cudart extra"
# What a toolkit installed by NVIDIA's packages also has, and CMake's FindCUDAToolkit looks for.
ln -sfn lib "$root/lib64"
ln -sfn "libcudart.so.${torch_cuda%%.*}" "$root/lib/libcudart.so"
mkdir -p "$root/targets/$(uname -m)-linux"
ln -sfn ../../include "$root/targets/$(uname -m)-linux/include"
ln -sfn ../../lib "$root/targets/$(uname -m)-linux/lib"
[ -e /usr/local/cuda ] || ln -s "$root" /usr/local/cuda
/usr/local/cuda/bin/nvcc --version | tail -n 2
echo "[cuda] toolkit $toolkit from PyPI in $root (/usr/local/cuda)"
