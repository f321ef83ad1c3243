#!/usr/bin/env bash
# On a machine WITH registry access (`make gpu-bundle`): fill a folder (default .gpu_bundle/, git-ignored) with
# what a GPU node without network lacks for scripts/gpu_check.sh: the Horovod 0.28.1 sdist and the cp312
# manylinux x86_64 wheels of the dependencies (datasets and evaluate at requirements.txt's pins, and their
# tree), less the big wheels of packages the node's image already holds (scripts/gpu_node_packages.txt; each
# one left out is printed with what needs it). At most 50 MiB (HVT_BUNDLE_MAX_MIB), else exit 1: carried to a
# lent machine, it shares the 64 MiB of working tree with the checkout. Then, on the node (docs/performance.md):
#   HVT_WHEELS=.gpu_bundle bash scripts/gpu_check.sh
#
# The tree is resolved with `pip install --dry-run --report` for the node's platform (metadata only), then
# downloaded with --no-deps and trimmed (python -m horovod_train.gpucheck.bundle). HVT_BUNDLE_WITH="pyarrow ..."
# carries packages the node has anyway (when its version does not fit); HVT_BUNDLE_SMALL_MIB (default 1): the wheels
# under it are carried even when the node has the package (0: none); HVT_BUNDLE_EXTRA adds requirements.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$ROOT/.gpu_bundle}
PY=${PYTHON:-$ROOT/.venv/bin/python}
PLATFORM=(--only-binary :all: --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mapfile -t WANT < <(grep -E '^(datasets|evaluate)==' "$ROOT/requirements.txt")
# Horovod's setup.py asks setuptools for cffi (setup_requires), which fetches it from the network unless installed.
WANT+=("cffi>=1.4.0")
read -r -a EXTRA <<<"${HVT_BUNDLE_EXTRA:-}"
WANT+=("${EXTRA[@]+"${EXTRA[@]}"}")

mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --no-binary :all: -d "$DEST" "horovod==0.28.1"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip install -q --dry-run --ignore-installed --report "$WORK/report.json" --target "$WORK/target" \
    "${PLATFORM[@]}" "${WANT[@]}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
mapfile -t PINS < <("$PY" -m horovod_train.gpucheck.bundle pins "$WORK/report.json")
echo "[bundle] the tree of ${WANT[*]}: ${#PINS[@]} packages"
"$PY" -m pip download -q --no-deps -d "$DEST" "${PLATFORM[@]}" "${PINS[@]}"
"$PY" -m horovod_train.gpucheck.bundle trim "$DEST" --report "$WORK/report.json" \
    --on_node "$ROOT/scripts/gpu_node_packages.txt" --carry "${HVT_BUNDLE_WITH:-}" --max_mib "${HVT_BUNDLE_MAX_MIB:-50}" \
    --small_mib "${HVT_BUNDLE_SMALL_MIB:-1}"
