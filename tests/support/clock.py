"""Where the suite's time goes (a pytest plugin, loaded by tests/conftest.py).

Every test's setup, call and teardown, and every fixture's setup, are timed. At the end the terminal summary
shows each tier's share, the background builds (images, the NCCL build: support/builds.py) with their own CPU,
the slowest fixtures (the installed wheel, clusters; each paid once per scope) and the slowest tests with their
fixtures' share of them. With ``HVT_CLOCK_FILE`` set (``scripts/test.sh`` sets it) the numbers are also written
there as JSON, for the table that ends ``make test``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from support.clock_table import table


class Clock:
    def __init__(self) -> None:
        self.tests: dict[str, dict[str, float]] = defaultdict(dict)  # nodeid -> {setup, call, teardown, fixtures}
        self.fixtures: list[dict] = []  # each setup of a fixture that took time: name, scope, seconds, for whom
        self.started = time.monotonic()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        start = time.monotonic()
        yield
        seconds = time.monotonic() - start
        item = getattr(request, "_pyfuncitem", None)  # the test whose setup needed it
        node = item.nodeid if item is not None else request.node.nodeid
        self.tests[node]["fixtures"] = self.tests[node].get("fixtures", 0.0) + seconds
        if seconds >= 0.5:
            self.fixtures.append({"name": fixturedef.argname, "scope": fixturedef.scope, "seconds": seconds,
                                  "for": node})  # fmt: skip

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item):
        """The CPU time a test costs, its processes' included (those it waited for: a launcher's ranks too): on
        a loaded machine wall times swell, CPU seconds much less, so they show the work a change adds."""
        before = cpu_seconds()
        yield
        self.tests[item.nodeid]["cpu"] = cpu_seconds() - before
        if os.environ.get("HVT_CLOCK_FILE"):  # as it goes: a run killed at CI's limit still shows its costs
            with open(os.environ["HVT_CLOCK_FILE"] + ".jsonl", "a") as log:
                log.write(json.dumps({"id": item.nodeid, **self.tests[item.nodeid]}) + "\n")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.tests[report.nodeid][report.when] = report.duration

    def summary(self) -> dict:
        phases = ("setup", "call", "teardown")
        tests = [
            {"id": nodeid, "tier": tier_of(nodeid), "seconds": sum(t.get(w, 0.0) for w in phases),
             "fixtures": min(t.get("fixtures", 0.0), t.get("setup", 0.0)), "cpu": t.get("cpu", 0.0)}
            for nodeid, t in self.tests.items() if "call" in t or "setup" in t
        ]  # fmt: skip
        tiers: dict[str, float] = defaultdict(float)
        cpu: dict[str, float] = defaultdict(float)
        for test in tests:
            tiers[test["tier"]] += test["seconds"]
            cpu[test["tier"]] += test["cpu"]
        return {
            "wall_s": time.monotonic() - self.started,
            "tiers": dict(sorted(tiers.items())),
            "tiers_cpu": dict(sorted(cpu.items())),
            "tests": sorted(tests, key=lambda t: -t["seconds"]),
            "fixtures": sorted(self.fixtures, key=lambda f: -f["seconds"]),
            "builds": list(BACKGROUND),
        }

    def pytest_terminal_summary(self, terminalreporter) -> None:
        found = self.summary()
        if not found["tests"]:  # --collect-only, or nothing selected
            return
        # pytest's counts, for the verdict that scripts/clock_report.py prints last (below the table)
        found["outcomes"] = {kind: len(terminalreporter.stats.get(kind, [])) for kind in OUTCOMES}
        if os.environ.get("HVT_CLOCK_FILE"):
            Path(os.environ["HVT_CLOCK_FILE"]).write_text(json.dumps(found, indent=1) + "\n")
        write = terminalreporter.write_line
        terminalreporter.section("where the time went (tests/support/clock.py)")
        for line in table(found):
            write(line)


OUTCOMES = ("failed", "passed", "skipped", "xfailed", "xpassed", "error")  # in pytest's order, its names


# The background builds this process reaped (support/builds.py): name, seconds, cpu, exit status. A build ends
# during whatever test runs then, and its CPU would count as that test's (a cold run's SLURM test showed 12.8
# CPU-minutes, most of them the GPU image's): it is the build's own row of the table instead.
BACKGROUND: list[dict] = []
_REAPING = threading.Lock()  # a reap and its record together, as cpu_seconds() reads them


def reap_background(name: str, process: subprocess.Popen, started: float) -> int | None:
    """``process``'s exit status if it has ended (reaped here, without waiting), else None. Its CPU, with that of
    the processes it waited for, goes to ``name``'s row, out of the test that was running."""
    with _REAPING:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid == 0:
            return None
        process.returncode = os.waitstatus_to_exitcode(status)
        BACKGROUND.append({"name": name, "seconds": time.monotonic() - started,
                           "cpu": usage.ru_utime + usage.ru_stime, "status": process.returncode})  # fmt: skip
        return process.returncode


def cpu_seconds() -> float:
    """This process's CPU and its reaped children's, the background builds' left out."""
    with _REAPING:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        builds = sum(build["cpu"] for build in BACKGROUND)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime - builds


def tier_of(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # once, in the process that reports
        config.pluginmanager.register(Clock(), "hvt-clock")
