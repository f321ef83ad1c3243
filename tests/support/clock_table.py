"""The suite's time as text (standard library only: scripts/clock_report.py prints it even when setup failed)."""

from __future__ import annotations

SLOWEST_TESTS = 20
SLOWEST_FIXTURES = 12


def minutes(seconds: float) -> str:
    return f"{seconds / 60:5.1f} min" if seconds >= 60 else f"{seconds:5.1f} s  "


def table(found: dict) -> list[str]:
    """The pytest part of the report: tiers, the slowest fixtures, the slowest tests."""
    lines = [f"pytest wall {minutes(found['wall_s'])}; by tier (sum of its tests, fixtures included):"]
    lines += [f"  {tier:<12} {minutes(seconds)}" for tier, seconds in found["tiers"].items()]
    lines.append(f"slowest fixture setups (paid once per scope; {SLOWEST_FIXTURES} shown):")
    for fixture in found["fixtures"][:SLOWEST_FIXTURES]:
        lines.append(f"  {minutes(fixture['seconds'])}  {fixture['name']} ({fixture['scope']}) for {fixture['for']}")
    lines.append(f"slowest tests ({SLOWEST_TESTS} shown; in brackets the fixtures' share of it):")
    for test in found["tests"][:SLOWEST_TESTS]:
        lines.append(f"  {minutes(test['seconds'])} [{minutes(test['fixtures']).strip()}]  {test['id']}")
    return lines
