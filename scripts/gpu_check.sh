#!/usr/bin/env bash
# One command on a GPU node, no network needed (`make gpu-check`): the node's facts, the missing wheels, Horovod
# built offline (with NCCL, and without it for two ranks on one GPU), then NCCL's collectives, BERT-base's
# throughput and MFU, Horovod's and DDP's gradient all-reduce with two ranks on the one GPU, and the rest, most
# valuable first, each step only if its estimated time fits in --budget_s (default 480). The report lands in
# $OUT/gpu_check (else runs/gpu_check): gpu_check.json, .txt, .log, details.tar.gz, the built wheels in parts.
#
#   HVT_WHEELS=.gpu_bundle bash scripts/gpu_check.sh --budget_s 390   # a lent machine (docs/performance.md)
#   scripts/gpu_check.sh --dry-run          # or HVT_GPU_CHECK_DRY=1: the node's plan, then CPU, tiny sizes
#   scripts/gpu_check.sh --plan-only        # the plan with each step's estimated seconds
#
# The python is $PYTHON, else the node's python3; its torch must be a CUDA build (else exit 2). A system
# python gets a venv (.venv-gpu, --system-site-packages: the node's torch and libraries stay in use);
# a python already in a venv is used as it is. Missing dependencies come from $HVT_WHEELS (pip
# --no-index), Horovod from $HOROVOD_SDIST, a horovod wheel, or the wheel parts an earlier run kept, in
# $HVT_WHEELS; see scripts/gpu_bundle.sh for making that folder on a machine with network. The steps and the
# report: horovod_train/gpucheck/ (`python -m horovod_train.gpucheck --help`, which also runs from an
# installed wheel); extra arguments are passed to it (--budget_s, --steps a,b, --output_dir, ...).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

BUNDLE=$ROOT/.gpu_bundle  # scripts/gpu_bundle.sh's default folder, used when present
if [ -z "${HVT_WHEELS:-}" ] && [ -d "$BUNDLE" ]; then export HVT_WHEELS=$BUNDLE; fi
if [ -z "${HOROVOD_SDIST:-}" ] && [ -n "${HVT_WHEELS:-}" ]; then
    HOROVOD_SDIST=$(find "$HVT_WHEELS" -maxdepth 1 -name 'horovod-*.tar.gz' | sort | head -1)
fi
if [ -n "${HOROVOD_SDIST:-}" ]; then
    HOROVOD_SDIST=$(realpath "$HOROVOD_SDIST")
    export HOROVOD_SDIST
else
    unset HOROVOD_SDIST
fi
if [ -n "${HVT_WHEELS:-}" ]; then
    HVT_WHEELS=$(realpath "$HVT_WHEELS")
    export HVT_WHEELS
fi
DRY=${HVT_GPU_CHECK_DRY:-0}
ARGS=()
for arg in "$@"; do
    case "$arg" in
        --dry-run | --dry_run) DRY=1 ;;
        --plan-only | --plan_only) DRY=1; ARGS+=("$arg") ;;  # prints the node's plan anywhere, runs nothing
        *) ARGS+=("$arg") ;;
    esac
done

if [ "$DRY" = 1 ]; then
    PY=${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3 )}
else
    PY=${PYTHON:-python3}
fi
if ! command -v "$PY" >/dev/null; then
    echo "error: no python at $PY; fix: set PYTHON to the node's python with a CUDA torch" >&2
    exit 2
fi
PY=$(command -v "$PY")

if ! cuda=$("$PY" -c 'import torch; print(torch.version.cuda or "", torch.cuda.is_available())' 2>/dev/null); then
    cuda=" False"
fi
if [ "$DRY" != 1 ]; then
    if [[ "$cuda" != *" True" || "$cuda" == " "* ]]; then
        echo "error: $PY has no CUDA build of torch or sees no GPU (torch.version.cuda, available: ${cuda:-none}); fix: run on a GPU node, set PYTHON to a python with a CUDA torch, or use --dry-run" >&2
        exit 2
    fi
    if "$PY" -c 'import sys; sys.exit(0 if sys.prefix == sys.base_prefix else 1)'; then
        VENV=${HVT_GPU_VENV:-$ROOT/.venv-gpu}
        if [ ! -x "$VENV/bin/python" ]; then
            echo "[gpu-check] creating $VENV (--system-site-packages: uses the node's torch)"
            "$PY" -m venv --system-site-packages "$VENV"
        fi
        PY=$VENV/bin/python
    fi
fi

echo "[gpu-check] python $PY (torch CUDA: ${cuda% *}), dry run: $([ "$DRY" = 1 ] && echo yes || echo no)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "$DRY" = 1 ]; then ARGS=(--dry_run "${ARGS[@]+"${ARGS[@]}"}"); fi
exec "$PY" -m horovod_train.gpucheck --python "$PY" --scripts_dir "$ROOT/scripts" "${ARGS[@]+"${ARGS[@]}"}"
