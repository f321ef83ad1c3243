"""The table that ends `make test` (scripts/test.sh): pytest's own breakdown (the slowest tests, the builds and
other slow fixtures, the tiers) from tests/support/clock.py's JSON, then each phase's wall time, and last the
verdict (passed or failed, pytest's counts), so that the tail of a log shows it. Standard library only:
it runs even when setup failed. ``--module-seconds DIR``: the integration modules' seconds from a kept clock, as
tests/support/module_seconds.json holds them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.clock_table import merge, minutes, table  # noqa: E402


def main(clock_dir: str) -> None:
    folder = Path(clock_dir)
    phases = []  # (name, start, end, exit status), epoch seconds
    if (folder / "phases.tsv").is_file():
        for line in (folder / "phases.tsv").read_text().splitlines():
            name, start, end, status = line.split("\t")
            phases.append((name, float(start), float(end), int(status)))
    print("\n=== where the time went ===")
    clocks = {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}
    if clocks:
        for line in table(merge(clocks)):
            print(line)
    print("phases:")
    for name, start, end, status in phases:
        print(f"  {name:<12} {minutes(end - start)}{'' if status == 0 else f'  (exit {status})'}")
    print(f"  {'total':<12} {minutes(sum(end - start for _, start, end, _ in phases))}")
    if (folder / "cpu.tsv").is_file():
        print("machine CPU (/proc/stat, every process on it; sampled every 10 s):")
        spans = [(name, start, end) for name, start, end, _ in phases]
        for line in cpu_lines((folder / "cpu.tsv").read_text(), spans):
            print(line)
    if (folder / "disk.tsv").is_file():
        print("disk (free on each filesystem the run writes to, sampled every 10 s):")
        for line in disk_lines((folder / "disk.tsv").read_text()):
            print(line)
    print(verdict(phases, clocks))


def verdict(phases: list[tuple[str, float, float, int]], clocks: dict[str, dict]) -> str:
    """The run's last line, below the table (pytest's own comes above it): passed or failed, pytest's counts
    summed over its processes, and the phase that failed."""
    counts: dict[str, int] = {}
    for clock in clocks.values():
        for kind, n in clock.get("outcomes", {}).items():
            counts[kind] = counts.get(kind, 0) + n
    said = ", ".join(f"{n} {'errors' if kind == 'error' else kind}" for kind, n in counts.items() if n)
    failed = next(((name, status) for name, _, _, status in phases if status != 0), None)
    total = minutes(sum(end - start for _, start, end, _ in phases)).strip()
    if failed is None and not counts.get("failed") and not counts.get("error"):
        return f"=== PASSED: {said or 'no tests ran'} in {total} ==="
    where = f"{failed[0]} exited {failed[1]}" if failed else "pytest"
    return f"=== FAILED ({where}): {said or 'no tests ran'} in {total} ==="


WINDOW_S = 300  # the idle share is shown per 5 minutes of the longest phase: where in the run the cores idled


def cpu_lines(samples: str, phases: list[tuple[str, float, float]]) -> list[str]:
    """Busy core-minutes and the idle share over the run, per phase, and per 5 minutes of the longest phase.
    ``samples``: epoch seconds, busy and idle jiffies summed over the cores."""
    points = []
    for line in samples.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            points.append((float(parts[0]), int(parts[1]), int(parts[2])))
    if len(points) < 2:
        return []
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def between(start: float, end: float) -> tuple[float, float]:
        """Busy and idle CPU seconds between the samples nearest ``start`` and ``end``."""
        first = min(points, key=lambda p: abs(p[0] - start))
        last = min(points, key=lambda p: abs(p[0] - end))
        return (last[1] - first[1]) / tick, (last[2] - first[2]) / tick

    def line(name: str, start: float, end: float) -> str:
        busy, idle = between(start, end)
        share = idle / (busy + idle) if busy + idle else 0.0
        return f"  {name:<12} busy {busy / 60:6.1f} core-min, idle {idle / 60:5.1f} ({share:4.0%})"

    lines = [line("all", points[0][0], points[-1][0])]
    lines += [line(name, start, end) for name, start, end in phases if end - start >= 60]
    if phases:
        name, start, end = max(phases, key=lambda phase: phase[2] - phase[1])
        shares = []
        for left in range(int(start), int(end), WINDOW_S):
            busy, idle = between(left, min(left + WINDOW_S, end))
            shares.append(f"{idle / (busy + idle):.0%}" if busy + idle else "-")
        lines.append(f"  idle share of {name}, each 5 min: {' '.join(shares)}")
    return lines


def disk_lines(samples: str) -> list[str]:
    """One line per mount point: its free space at the first sample and the least seen (df's 1 KiB blocks)."""
    free: dict[str, list[int]] = {}
    for line in samples.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[2].isdigit():
            free.setdefault(parts[1], []).append(int(parts[2]))
    return [f"  {mount:<12} {kib[0] / 2**20:6.1f} GiB at the start, {min(kib) / 2**20:6.1f} GiB at the least"
            for mount, kib in free.items()]  # fmt: skip


def module_seconds(clock_dir: str) -> dict[str, int]:
    """The shared tier's modules by the seconds their tests took in a kept clock, longest first: the order the
    pytest processes take them in (tests/support/sharing.py reads tests/support/module_seconds.json)."""
    seconds: dict[str, float] = {}
    for path in Path(clock_dir).glob("*.json"):
        for test in json.loads(path.read_text()).get("tests", []):
            module = test["id"].split("::")[0]
            if module.startswith("tests/integration/"):
                seconds[module] = seconds.get(module, 0.0) + test["seconds"]
    return {module: round(s) for module, s in sorted(seconds.items(), key=lambda item: -item[1])}


if __name__ == "__main__":
    if sys.argv[1] == "--module-seconds":
        print(json.dumps(module_seconds(sys.argv[2]), indent=1))
    else:
        main(sys.argv[1])
