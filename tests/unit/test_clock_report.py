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


def _clock_dir(tmp_path, phases: list[tuple[str, float, float, int]], outcomes: list[dict[str, int]]):
    (tmp_path / "phases.tsv").write_text("".join(f"{n}\t{s}\t{e}\t{rc}\n" for n, s, e, rc in phases))
    (tmp_path / "cpu.tsv").write_text(samples([(2, 0)] * 12))
    (tmp_path / "disk.tsv").write_text("1000\t/tmp\t1048576\n")
    for i, counts in enumerate(outcomes):
        clock = {"wall_s": 60, "tiers": {}, "tiers_cpu": {}, "tests": [], "fixtures": [], "builds": []}
        (tmp_path / f"pytest-{i}.json").write_text(json.dumps({**clock, "outcomes": counts}))
    return tmp_path


def test_the_verdict_is_the_last_line_below_the_cpu_and_disk_tables(tmp_path, capsys):
    """`make test-fast`'s pass/fail line was 40 lines above the end (issue 58): it is the last line now, with
    pytest's counts summed over its processes and the phase that failed."""
    passed = [("setup", 1000.0, 1010.0, 0), ("pytest", 1010.0, 1120.0, 0)]
    clock_report.main(str(_clock_dir(tmp_path, passed, [{"passed": 400, "skipped": 1}, {"passed": 2}])))
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "=== PASSED: 402 passed, 1 skipped in 2.0 min ===", lines[-3:]
    assert any(line.startswith("disk") for line in lines[:-1])
    failed = [("setup", 1000.0, 1010.0, 0), ("pytest", 1010.0, 1120.0, 1)]
    (tmp_path / "failed").mkdir()
    clock_report.main(str(_clock_dir(tmp_path / "failed", failed, [{"failed": 1, "passed": 399}])))
    assert (
        capsys.readouterr().out.splitlines()[-1] == "=== FAILED (pytest exited 1): 1 failed, 399 passed in 2.0 min ==="
    )


def test_a_run_stopped_before_pytest_says_which_phase(tmp_path, capsys):
    clock_report.main(str(_clock_dir(tmp_path, [("setup", 0.0, 5.0, 0), ("lint", 5.0, 9.0, 1)], [])))
    assert capsys.readouterr().out.splitlines()[-1] == "=== FAILED (lint exited 1): no tests ran in 9.0 s ==="
