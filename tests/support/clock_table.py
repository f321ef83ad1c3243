"""The suite's time as text (standard library only: scripts/clock_report.py prints it even when setup failed)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

SLOWEST_TESTS = 20
SLOWEST_FIXTURES = 12


def minutes(seconds: float) -> str:
    return f"{seconds / 60:5.1f} min" if seconds >= 60 else f"{seconds:5.1f} s  "


def merge(found: dict[str, dict]) -> dict:
    """The clocks of pytest processes that ran at once (scripts/test.sh: three, each after a tier of its own,
    sharing the integration tier) as one: a tier's time is summed over the processes, the wall is the longest one's."""
    runs = list(found.values())
    return {
        "wall_s": max(run["wall_s"] for run in runs),
        "processes": {name: run["wall_s"] for name, run in found.items()},
        "tiers": _summed(run["tiers"] for run in runs),
        "tiers_cpu": _summed(run.get("tiers_cpu", {}) for run in runs),
        "tests": sorted((t for run in runs for t in run["tests"]), key=lambda t: -t["seconds"]),
        "fixtures": sorted((f for run in runs for f in run["fixtures"]), key=lambda f: -f["seconds"]),
        "builds": [b for run in runs for b in run.get("builds", [])],
    }


def _summed(tiers: Iterable[dict[str, float]]) -> dict[str, float]:
    total: Counter[str] = Counter()
    for found in tiers:
        total.update(found)  # adds
    return dict(sorted(total.items()))


def table(found: dict) -> list[str]:
    """The pytest part of the report, the most detailed first and the totals last: a CI log shown by its tail keeps
    the tiers (and the phases that scripts/clock_report.py prints after them)."""
    lines = [f"slowest tests ({SLOWEST_TESTS} shown; in brackets the fixtures' share of it, then CPU seconds):"]
    for test in found["tests"][:SLOWEST_TESTS]:
        shares = f"[{minutes(test['fixtures']).strip()}; cpu {minutes(test.get('cpu', 0.0)).strip()}]"
        lines.append(f"  {minutes(test['seconds'])} {shares}  {test['id']}")
    lines.append(f"slowest fixture setups (paid once per scope; {SLOWEST_FIXTURES} shown):")
    for fixture in found["fixtures"][:SLOWEST_FIXTURES]:
        lines.append(f"  {minutes(fixture['seconds'])}  {fixture['name']} ({fixture['scope']}) for {fixture['for']}")
    if found.get("builds"):
        lines.append("background builds (beside the tests; their CPU is theirs, not the test's that ran as one ended):")
        for build in found["builds"]:
            status = "" if build["status"] == 0 else f" (exit {build['status']})"
            lines.append(f"  {minutes(build['seconds'])}  cpu {minutes(build['cpu']).strip()}  {build['name']}{status}")
    processes = found.get("processes", {})
    if len(processes) > 1:
        at_once = ", ".join(f"{name} {minutes(s).strip()}" for name, s in processes.items())
        lines.append(f"pytest processes at once: {at_once}")
    lines.append(f"pytest wall {minutes(found['wall_s'])}; by tier (sum of its tests, fixtures included; CPU seconds, "
                 "the tests' processes included):")  # fmt: skip
    cpu = found.get("tiers_cpu", {})
    lines += [
        f"  {tier:<12} {minutes(seconds)}  cpu {minutes(cpu.get(tier, 0.0))}"
        for tier, seconds in found["tiers"].items()
    ]
    return lines
