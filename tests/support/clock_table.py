"""The suite's time as text (standard library only: scripts/clock_report.py prints it even when setup failed)."""

from __future__ import annotations

SLOWEST_TESTS = 20
SLOWEST_FIXTURES = 12


def minutes(seconds: float) -> str:
    return f"{seconds / 60:5.1f} min" if seconds >= 60 else f"{seconds:5.1f} s  "


def table(found: dict) -> list[str]:
    """The pytest part of the report: tiers, the slowest fixtures, the slowest tests."""
    lines = [f"pytest wall {minutes(found['wall_s'])}; by tier (sum of its tests, fixtures included; CPU seconds, "
             "the tests' processes included):"]  # fmt: skip
    cpu = found.get("tiers_cpu", {})
    lines += [
        f"  {tier:<12} {minutes(seconds)}  cpu {minutes(cpu.get(tier, 0.0))}"
        for tier, seconds in found["tiers"].items()
    ]
    lines.append(f"slowest fixture setups (paid once per scope; {SLOWEST_FIXTURES} shown):")
    for fixture in found["fixtures"][:SLOWEST_FIXTURES]:
        lines.append(f"  {minutes(fixture['seconds'])}  {fixture['name']} ({fixture['scope']}) for {fixture['for']}")
    lines.append(f"slowest tests ({SLOWEST_TESTS} shown; in brackets the fixtures' share of it, then CPU seconds):")
    for test in found["tests"][:SLOWEST_TESTS]:
        shares = f"[{minutes(test['fixtures']).strip()}; cpu {minutes(test.get('cpu', 0.0)).strip()}]"
        lines.append(f"  {minutes(test['seconds'])} {shares}  {test['id']}")
    return lines
