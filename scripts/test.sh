#!/usr/bin/env bash
# `make test` (and CI's .ci/run): setup, the system tools the tests drive, lint, the whole suite; then a table of
# where the time went, printed whether the run passed or not, so every run shows what each change costs.
# `scripts/test.sh fast` runs the unit tier alone (`make test-fast`). Extra pytest arguments: $PYTEST_ARGS.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit
VENV=${VENV:-$ROOT/.venv}
WHAT=${1:-all}
CLOCK=$(mktemp -d "${TMPDIR:-/tmp}/hvt-clock.XXXXXX")
export HVT_CLOCK_FILE=$CLOCK/pytest.json

# phase NAME COMMAND...: run it, record when it started and ended and its exit status.
phase() {
    local name=$1 start rc
    shift
    start=$EPOCHREALTIME
    "$@"
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$start" "$EPOCHREALTIME" "$rc" >>"$CLOCK/phases.tsv"
    return "$rc"
}

report() {
    local python=python3
    [ -x "$VENV/bin/python" ] && python=$VENV/bin/python
    "$python" scripts/clock_report.py "$CLOCK" || true
    rm -rf "$CLOCK"
}
trap report EXIT

phase setup bash scripts/setup.sh || exit
if [ "$WHAT" = all ]; then
    phase "test tools" bash scripts/install_test_tools.sh || exit
fi
phase lint bash -c "'$VENV/bin/ruff' check horovod_train tests && '$VENV/bin/ruff' format --check horovod_train tests" || exit
tests=()
[ "$WHAT" = fast ] && tests=(tests/unit)
# shellcheck disable=SC2086 # PYTEST_ARGS is word-split on purpose, as make passes it
PATH="$VENV/bin:$PATH" phase pytest "$VENV/bin/python" -m pytest "${tests[@]}" ${PYTEST_ARGS:-}
