#!/usr/bin/env bash
# Print `horovodrun --check-build` for the Horovod installed in $PYTHON's environment, and fail unless it
# lists PyTorch, MPI (unless HOROVOD_WITHOUT_MPI) and Gloo, plus NCCL when torch is a CUDA build (scripts/build_horovod.sh then builds
# with HOROVOD_GPU_OPERATIONS=NCCL). Shared by `make setup` (scripts/setup.sh) and docker/.
set -euo pipefail

PYTHON=${PYTHON:-python3}
BIN=$(dirname "$(command -v "$PYTHON")")
report=$("$BIN/horovodrun" --check-build)
echo "$report"
want=(PyTorch Gloo)
if [ -z "${HOROVOD_WITHOUT_MPI:-}" ]; then
    want+=(MPI)  # scripts/build_horovod.sh builds with MPI unless HOROVOD_WITHOUT_MPI is set
fi
if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)'; then
    want+=(NCCL)
fi
for item in "${want[@]}"; do
    if ! grep -qF "[X] $item" <<<"$report"; then
        echo "error: horovodrun --check-build does not list $item; fix: rebuild Horovod (rm -rf ~/.cache/horovod-train && make setup, or rebuild the image)" >&2
        exit 1
    fi
done
