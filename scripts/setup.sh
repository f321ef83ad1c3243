#!/usr/bin/env bash
# One-command install (`make setup`): MPI, a .venv with pinned dependencies, Horovod built once per
# machine (`horovod-train build-horovod`, through scripts/build_horovod.sh). Idempotent: a second run with
# nothing changed takes seconds.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=${VENV:-$ROOT/.venv}
BASE_PYTHON=${BASE_PYTHON:-python3}

# Each stage is a line when it starts and one with its time when it ends: a first install spends minutes in pip.
now_us() { echo "${EPOCHREALTIME/[.,]/}"; }
# since_us START: the time since START (now_us), as build-horovod writes it: 12.3 s, 4 min 05 s.
since_us() {
    local us=$(($(now_us) - $1))
    if [ "$us" -lt 60000000 ]; then
        printf '%d.%d s' $((us / 1000000)) $((us / 100000 % 10))
    else
        printf '%d min %02d s' $((us / 60000000)) $((us / 1000000 % 60))
    fi
}
# stage WHAT COMMAND...: run it between "[setup] WHAT ..." and "[setup] WHAT: done in T".
stage() {
    local what=$1 start
    shift
    start=$(now_us)
    echo "[setup] $what ..."
    "$@"
    echo "[setup] $what: done in $(since_us "$start")"
}
# pip with its progress (what it collects, downloads and installs), less a line per requirement already there.
pip_install() {
    "$PY" -m pip install "$@" | sed -u '/^Requirement already satisfied/d'
}
SETUP_START=$(now_us)

stage "MPI" bash scripts/install_mpi.sh

if [ ! -x "$VENV/bin/python" ]; then
    stage "creating $VENV" "$BASE_PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

# Skip pip entirely when the requirements have not changed since the last successful install.
STAMP="$VENV/.requirements.sha256"
WANT=$(cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    stage "pip: pip, setuptools, wheel, cmake" pip_install --upgrade pip setuptools wheel 'cmake<5'
    # --no-compile, then compileall on every core: pip byte-compiles what it installs one file after another, 57 of
    # the 97 s this install took on a 2-core machine with a warm pip cache; unpacked without it and compiled after,
    # 39 s and 34 s (2026-11-27). Some files do not compile on this Python (torch's Python 3.12 test
    # fixtures): pip skips them silently, and so does -qq.
    # torch first, from PyTorch's CPU index where there is no GPU (scripts/torch_index.py decides; TORCH_INDEX_URL
    # overrides): the pinned install below then keeps it.
    TORCH_PIN=$(grep -E '^torch==' requirements.txt)
    { read -r TORCH_INDEX; read -r TORCH_SAID; } < <("$PY" scripts/torch_index.py "$PY" "$TORCH_PIN")
    echo "[setup] $TORCH_SAID"
    if [ -n "$TORCH_INDEX" ]; then
        stage "pip: $TORCH_PIN (CPU build)" pip_install --no-compile --extra-index-url "$TORCH_INDEX" "$TORCH_PIN"
    fi
    stage "pip: the pinned dependencies (requirements-dev.txt; torch and transformers take minutes)" \
        pip_install --no-compile -r requirements-dev.txt
    stage "bytecode of the dependencies (every core)" \
        "$PY" -m compileall -qq -j 0 "$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
    stage "pip: horovod-train itself (editable)" pip_install --no-deps -e .
    echo "$WANT" > "$STAMP"
else
    echo "[setup] Python dependencies up to date"
fi

# The checkout's bytecode: pip compiles what it installs, but this package is installed editable, so its modules are
# compiled by whichever process imports them first; where PYTHONDONTWRITEBYTECODE is set (container and CI shells
# often set it), by every process again: each rank of each run. A fraction of a second here, once.
stage "bytecode of horovod_train" "$PY" -m compileall -q -j 0 horovod_train

# Horovod for this torch: `horovod-train build-horovod` (a cached wheel, nothing at all when it is installed). It
# prints `horovodrun --check-build`, and fails unless PyTorch, Gloo and MPI are listed, when it builds or installs
# Horovod; otherwise one line naming the Horovod installed.
install_horovod() {
    PYTHON="$PY" PATH="$VENV/bin:$PATH" bash scripts/build_horovod.sh | tee "$VENV/.horovod-check-build.txt"
}
stage "Horovod" install_horovod
echo "[setup] ready: $VENV (setup took $(since_us "$SETUP_START"))"
