"""The machine-CPU lines that end `make test`'s table (scripts/clock_report.py): busy and idle core-minutes from
/proc/stat samples, per phase and per 5 minutes of the longest phase."""

from __future__ import annotations

import importlib.util
import json
import os

from support.jobs import REPO

spec = importlib.util.spec_from_file_location("clock_report", REPO / "scripts" / "clock_report.py")
clock_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(clock_report)
TICK = os.sysconf("SC_CLK_TCK")


def samples(rates: list[tuple[float, float]], start: float = 1000.0) -> str:
    """One sample every 10 s; ``rates``: the busy and idle cores during each 10 s that follow a sample."""
    busy = idle = 0
    lines = []
    for i, (busy_cores, idle_cores) in enumerate([*rates, (0, 0)]):
        lines.append(f"{start + 10 * i}\t{busy}\t{idle}")
        busy, idle = busy + round(busy_cores * 10 * TICK), idle + round(idle_cores * 10 * TICK)
    return "\n".join(lines)


def test_busy_and_idle_core_minutes_per_phase_and_per_five_minutes():
    # 2 cores: 10 minutes full, then 5 minutes with one idle; pytest's second 5 minutes end 1 minute into those.
    text = samples([(2, 0)] * 60 + [(1, 1)] * 30)
    lines = clock_report.cpu_lines(text, [("setup", 1000.0, 1060.0), ("pytest", 1060.0, 1900.0)])
    assert lines[0] == "  all          busy   25.0 core-min, idle   5.0 ( 17%)"
    assert lines[1] == "  setup        busy    2.0 core-min, idle   0.0 (  0%)"
    assert lines[2] == "  pytest       busy   23.0 core-min, idle   5.0 ( 18%)"
    assert lines[3] == "  idle share of pytest, each 5 min: 0% 10% 50%"


def test_no_samples_no_lines():
    assert clock_report.cpu_lines("", []) == []
    assert clock_report.cpu_lines("1000.0\t5\t5\n", []) == []


def test_module_seconds_sums_each_integration_modules_tests_longest_first(tmp_path):
    """What tests/support/module_seconds.json holds: the order the pytest processes take the shared modules in."""
    tests = {"a": [("tests/integration/test_a.py::x", 30.0), ("tests/unit/test_u.py::y", 99.0)],
             "b": [("tests/integration/test_b.py::x", 50.0), ("tests/integration/test_a.py::z[1]", 40.4)]}  # fmt: skip
    for name, found in tests.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({"tests": [{"id": i, "seconds": s} for i, s in found]}))
    seconds = clock_report.module_seconds(str(tmp_path))
    assert list(seconds.items()) == [("tests/integration/test_a.py", 70), ("tests/integration/test_b.py", 50)]


def test_a_background_build_has_its_own_row_and_its_cpu_is_not_the_running_tests():
    """A build reaped during a test (support/builds.py's thread reaps it whenever it ends) is charged to its row,
    not to that test: here a shell loop (a build is a script) that burns some CPU, reaped between two readings."""
    import subprocess
    import time

    from support import clock
    from support.clock_table import table

    burn = "i=0; while [ $i -lt 150000 ]; do i=$((i + 1)); done"
    start = time.monotonic()
    before = clock.cpu_seconds()
    proc = subprocess.Popen(["bash", "-c", burn])
    try:
        while clock.reap_background("burner", proc, start) is None:
            time.sleep(0.05)
        after = clock.cpu_seconds()
        (row,) = [b for b in clock.BACKGROUND if b["name"] == "burner"]
        assert row["status"] == 0 and row["cpu"] >= 0.2, row
        assert after - before < row["cpu"] / 2, (before, after, row)  # the loop's CPU is not the test's
        lines = table({"tests": [], "fixtures": [], "wall_s": 1.0, "tiers": {}, "builds": [row]})
        assert any(line.endswith("  burner") and "cpu" in line for line in lines), lines
    finally:
        clock.BACKGROUND[:] = [b for b in clock.BACKGROUND if b["name"] != "burner"]
