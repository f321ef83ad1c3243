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

# cpu_sample: the machine's busy and idle CPU time so far (/proc/stat: every process's, daemons' and containers'
# that no test reaps too; a VM's steal is neither), so that the table shows whether the cores were full.
cpu_sample() {
    local cpu user nice system idle iowait irq softirq
    if read -r cpu user nice system idle iowait irq softirq _ </proc/stat 2>/dev/null && [ "$cpu" = cpu ]; then
        printf '%s\t%s\t%s\n' "$EPOCHREALTIME" "$((user + nice + system + irq + softirq))" \
            "$((idle + iowait))" >>"$CLOCK/cpu.tsv"
    fi
}
# machine_watch: every 10 s, a CPU sample and the free space of each filesystem the suite writes to (temporary
# files, Podman's image storage, the checkout), so that the table shows the least there was. A run that fills the
# disk fails wherever it happens to write next (stop 41's CI: "No space left on device" in tmp_path's setup); this
# shows how close it came.
machine_watch() {
    local places=("${TMPDIR:-/tmp}" "$ROOT")
    [ -d /var/lib/containers ] && places+=(/var/lib/containers)
    while :; do
        df -Pk "${places[@]}" 2>/dev/null | awk -v t="$EPOCHSECONDS" 'NR > 1 {print t "\t" $6 "\t" $4}' \
            >>"$CLOCK/disk.tsv"
        cpu_sample
        sleep 10
    done
}
machine_watch &
MACHINE_WATCH=$!

report() {
    kill "$MACHINE_WATCH" 2>/dev/null
    cpu_sample
    local python=python3
    [ -x "$VENV/bin/python" ] && python=$VENV/bin/python
    "$python" scripts/clock_report.py "$CLOCK" || true
    # HVT_CLOCK_KEEP=DIR keeps the raw clock (every test's seconds, the logs) for a closer look than the table.
    if [ -n "${HVT_CLOCK_KEEP:-}" ]; then
        mkdir -p "$HVT_CLOCK_KEEP" && cp -r "$CLOCK"/. "$HVT_CLOCK_KEEP"/
    fi
    rm -rf "$CLOCK"
}
trap report EXIT

phase setup bash scripts/setup.sh || exit
if [ "$WHAT" = all ]; then
    phase "test tools" bash scripts/install_test_tools.sh || exit
fi
phase lint bash -c "'$VENV/bin/ruff' check horovod_train tests && '$VENV/bin/ruff' format --check horovod_train tests" || exit
# pytest_run NAME PATH...: one pytest process, its clock in $CLOCK/NAME.json.
pytest_run() {
    local name=$1
    shift
    # shellcheck disable=SC2086 # PYTEST_ARGS is word-split on purpose, as make passes it
    HVT_CLOCK_FILE=$CLOCK/$name.json PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pytest "$@" ${PYTEST_ARGS:-}
}

# Three pytest processes at once, sharing the integration tier module by module (tests/support/sharing.py: its tests
# use about one core each). Each runs a tier of its own first: tests/unit in the first; nothing more in the second;
# tests/system in the third (Podman images, SLURM clusters, network namespaces: much of it waiting on daemons, image
# layers and downloads), which then takes the integration modules still unclaimed, so that no core idles while two
# processes finish the tier. The suite is built for test runs side by side on one machine (docs/launch.md,
# Developers' notes). Their outputs follow one another. HVT_TIERS_IN_TURN=1 runs the tiers one after the other in
# one process.
all_tiers() {
    if [ "${HVT_TIERS_IN_TURN:-0}" = 1 ]; then
        pytest_run pytest tests
        return
    fi
    local system second rc=0 rc_second=0 rc_system=0
    mkdir "$CLOCK/claims"
    HVT_SHARE_DIR=$CLOCK/claims pytest_run system tests/system tests/integration >"$CLOCK/system.log" 2>&1 &
    system=$!
    HVT_SHARE_DIR=$CLOCK/claims HVT_EARLY_BUILDS=0 pytest_run integration-2 tests/integration \
        >"$CLOCK/integration-2.log" 2>&1 &
    second=$!
    HVT_SHARE_DIR=$CLOCK/claims pytest_run pytest tests/unit tests/integration || rc=$?
    wait "$second" || rc_second=$?
    wait "$system" || rc_system=$?
    echo
    echo "=== the second process of tests/integration, which ran beside the one above ==="
    cat "$CLOCK/integration-2.log"
    echo
    echo "=== tests/system and then tests/integration's modules left, which ran beside them ==="
    cat "$CLOCK/system.log"
    local code
    for code in "$rc" "$rc_second" "$rc_system"; do
        [ "$code" -eq 0 ] || return "$code"
    done
}

if [ "$WHAT" = fast ]; then
    phase pytest pytest_run pytest tests/unit
else
    phase pytest all_tiers
fi
