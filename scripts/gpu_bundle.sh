#!/usr/bin/env bash
# On a machine WITH registry access: fill a folder (default .gpu_bundle/, git-ignored) with what the GPU
# node lacks for scripts/gpu_check.sh: the Horovod sdist and the cp312 manylinux x86_64 wheels of the
# dependencies not already in its image (it has torch 2.11 cu130, transformers, accelerate, mpi4py,
# numpy, huggingface-hub, NCCL from pip; not datasets or evaluate). Carry the folder to the node (at most
# 64 MiB at a time) and run `HVT_WHEELS=.gpu_bundle scripts/gpu_check.sh` there.
#
# The dependency tree is resolved with `pip install --dry-run --report` for the node's platform (metadata
# only), then only the packages the node lacks are downloaded (--no-deps). HVT_BUNDLE_ON_NODE lists what
# the node already has (pip names, space separated); HVT_BUNDLE_EXTRA adds requirements.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$ROOT/.gpu_bundle}
PY=${PYTHON:-$ROOT/.venv/bin/python}
PLATFORM=(--only-binary :all: --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
ON_NODE=${HVT_BUNDLE_ON_NODE:-"torch transformers tokenizers safetensors huggingface-hub accelerate mpi4py numpy
    pyyaml packaging filelock fsspec tqdm requests urllib3 idna certifi charset-normalizer regex jinja2 markupsafe
    networkx sympy mpmath typing-extensions psutil setuptools hf-xet httpx httpcore h11 anyio sniffio
    shellingham typer click rich markdown-it-py mdurl pygments triton cmake ninja"}
# what horovod-train needs beyond the node's image (requirements.txt, less torch and what the node has)
WANT=("datasets==5.2.0" "evaluate==0.4.6" cloudpickle "matplotlib==3.11.2" wheel)
read -r -a EXTRA <<<"${HVT_BUNDLE_EXTRA:-}"
WANT+=("${EXTRA[@]+"${EXTRA[@]}"}")

mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --no-binary :all: -d "$DEST" "horovod==0.28.1"
REPORT=$(mktemp)
trap 'rm -f "$REPORT"' EXIT
"$PY" -m pip install -q --dry-run --ignore-installed --report "$REPORT" --target "$(mktemp -d)" "${PLATFORM[@]}" "${WANT[@]}"
mapfile -t PINS < <("$PY" - "$REPORT" "$ON_NODE" <<'PY'
import json, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = {norm(n) for n in sys.argv[2].split()}
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    if norm(meta["name"]) not in have:
        print(f"{meta['name']}=={meta['version']}")
PY
)
echo "[bundle] downloading ${#PINS[@]} wheels: ${PINS[*]}"
"$PY" -m pip download -q --no-deps -d "$DEST" "${PLATFORM[@]}" "${PINS[@]}"
du -b "$DEST"/* | sort -n | awk '{printf "%8.1f MiB  %s\n", $1 / 1048576, $2}'
TOTAL=$(du -sb "$DEST" | cut -f1)
printf '[bundle] %s: %.1f MiB in all\n' "$DEST" "$(echo "$TOTAL / 1048576" | bc -l)"
if [ "$TOTAL" -gt $((60 * 1048576)) ]; then
    echo "[bundle] warning: over 60 MiB: carry it in two runs, or drop what the node has (HVT_BUNDLE_ON_NODE)" >&2
fi
