"""The table that ends `make test` (scripts/test.sh): each phase's wall time, then pytest's own breakdown (tiers,
the builds and other slow fixtures, the slowest tests) from tests/support/clock.py's JSON. Standard library only:
it runs even when setup failed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.clock_table import minutes, table  # noqa: E402


def main(clock_dir: str) -> None:
    folder = Path(clock_dir)
    phases = []
    if (folder / "phases.tsv").is_file():
        for line in (folder / "phases.tsv").read_text().splitlines():
            name, start, end, status = line.split("\t")
            phases.append((name, float(end) - float(start), int(status)))
    print("\n=== where the time went ===")
    for name, seconds, status in phases:
        print(f"{name:<12} {minutes(seconds)}{'' if status == 0 else f'  (exit {status})'}")
    print(f"{'total':<12} {minutes(sum(s for _, s, _ in phases))}")
    if (folder / "pytest.json").is_file():
        for line in table(json.loads((folder / "pytest.json").read_text())):
            print(line)


if __name__ == "__main__":
    main(sys.argv[1])
