"""Where the suite's time goes (a pytest plugin, loaded by tests/conftest.py).

Every test's setup, call and teardown, and every fixture's setup, are timed. At the end the terminal summary
shows each tier's share, the slowest fixtures (the builds: images, the NCCL build, the installed wheel, clusters;
each paid once per scope) and the slowest tests with their fixtures' share of them. With ``HVT_CLOCK_FILE`` set
(``scripts/test.sh`` sets it) the numbers are also written there as JSON, for the table that ends ``make test``.
"""

from __future__ import annotations

import json
import os
import resource
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
        }

    def pytest_terminal_summary(self, terminalreporter) -> None:
        found = self.summary()
        if not found["tests"]:  # --collect-only, or nothing selected
            return
        if os.environ.get("HVT_CLOCK_FILE"):
            Path(os.environ["HVT_CLOCK_FILE"]).write_text(json.dumps(found, indent=1) + "\n")
        write = terminalreporter.write_line
        terminalreporter.section("where the time went (tests/support/clock.py)")
        for line in table(found):
            write(line)


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def tier_of(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # once, in the process that reports
        config.pluginmanager.register(Clock(), "hvt-clock")
