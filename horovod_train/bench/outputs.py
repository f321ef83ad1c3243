"""What every benchmark writes: its rows as CSV and JSON, its plot as a PNG, and the median its rows report of
repeated measurements."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from horovod_train.common.files import write_json_atomic


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def write_rows(out_dir: Path, stem: str, columns: Sequence[str], rows: list[dict[str, Any]], **meta: Any) -> None:
    """``stem``.csv (the columns, one row each) and ``stem``.json (every field of every row, plus meta)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / f"{stem}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    write_json_atomic(out_dir / f"{stem}.json", {**meta, "columns": list(columns), "rows": rows})


def pyplot():
    """matplotlib's pyplot on the Agg backend (files, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
