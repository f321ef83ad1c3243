"""The table that ends `make test` (scripts/test.sh): pytest's own breakdown (the slowest tests, the builds and
other slow fixtures, the tiers) from tests/support/clock.py's JSON, then each phase's wall time, last so that the
tail of a log shows them. Standard library only:
it runs even when setup failed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.clock_table import merge, minutes, table  # noqa: E402


def main(clock_dir: str) -> None:
    folder = Path(clock_dir)
    phases = []
    if (folder / "phases.tsv").is_file():
        for line in (folder / "phases.tsv").read_text().splitlines():
            name, start, end, status = line.split("\t")
            phases.append((name, float(end) - float(start), int(status)))
    print("\n=== where the time went ===")
    clocks = {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}
    if clocks:
        for line in table(merge(clocks)):
            print(line)
    print("phases:")
    for name, seconds, status in phases:
        print(f"  {name:<12} {minutes(seconds)}{'' if status == 0 else f'  (exit {status})'}")
    print(f"  {'total':<12} {minutes(sum(s for _, s, _ in phases))}")
    if (folder / "disk.tsv").is_file():
        print("disk (free on each filesystem the run writes to, sampled every 10 s):")
        for line in disk_lines((folder / "disk.tsv").read_text()):
            print(line)


def disk_lines(samples: str) -> list[str]:
    """One line per mount point: its free space at the first sample and the least seen (df's 1 KiB blocks)."""
    free: dict[str, list[int]] = {}
    for line in samples.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[2].isdigit():
            free.setdefault(parts[1], []).append(int(parts[2]))
    return [f"  {mount:<12} {kib[0] / 2**20:6.1f} GiB at the start, {min(kib) / 2**20:6.1f} GiB at the least"
            for mount, kib in free.items()]  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
