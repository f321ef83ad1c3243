#!/usr/bin/env bash
# One-command install (`make setup`): MPI, a .venv with pinned dependencies, Horovod built once per
# machine (`horovod-train build-horovod`, through scripts/build_horovod.sh). Idempotent: a second run with
# nothing changed takes seconds.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=${VENV:-$ROOT/.venv}
BASE_PYTHON=${BASE_PYTHON:-python3}

bash scripts/install_mpi.sh

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV"
    "$BASE_PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

# Skip pip entirely when the requirements have not changed since the last successful install.
STAMP="$VENV/.requirements.sha256"
WANT=$(cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    echo "[setup] installing Python dependencies"
    "$PY" -m pip install -q --upgrade pip setuptools wheel 'cmake<5'
    "$PY" -m pip install -q -r requirements-dev.txt
    "$PY" -m pip install -q --no-deps -e .
    echo "$WANT" > "$STAMP"
else
    echo "[setup] Python dependencies up to date"
fi

# Horovod for this torch: `horovod-train build-horovod` (a cached wheel, nothing at all when it is installed),
# which prints `horovodrun --check-build` and fails unless PyTorch, Gloo and MPI are listed.
PYTHON="$PY" PATH="$VENV/bin:$PATH" bash scripts/build_horovod.sh | tee "$VENV/.horovod-check-build.txt"
echo "[setup] ready: $VENV"
