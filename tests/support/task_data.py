"""Regression and multi-label data files (issue 21's task shapes), from synthetic-nli's sentence pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from horovod_train.data import synthetic

TOPICS = ("people", "places", "things")  # the multi-label names
PLACES = ("harbor", "station", "garage", "kitchen", "office", "garden", "library", "market")


def similarity(row: dict, i: int) -> float:
    """An STS-B-like score in [0, 5] that follows the NLI label, with a fractional part."""
    return round({0: 4.0, 1: 2.5, 2: 0.5}[row["label"]] + (i % 7) / 10, 2)


def topics(row: dict, i: int) -> list[str]:
    """0 to 3 topic names per example, from its words (some examples have none)."""
    words = set(row["premise"].split())
    found = ["people"] if i % 3 else []
    found += ["places"] if words & set(PLACES) else []
    found += ["things"] if row["label"] == 2 else []
    return found


def write_regression_csv(path: Path, n: int, seed: int) -> list[float]:
    """sentence1,sentence2,label (a float score), as STS-B's columns."""
    rows = synthetic.generate(n, seed)
    scores = [similarity(row, i) for i, row in enumerate(rows)]
    frame = pd.DataFrame({"sentence1": [r["premise"] for r in rows], "sentence2": [r["hypothesis"] for r in rows],
                          "label": scores})  # fmt: skip
    frame.to_csv(path, index=False)
    return scores


def write_multi_label_jsonl(path: Path, n: int, seed: int) -> list[list[str]]:
    """{"text": ..., "label": ["people", "places"]} per line."""
    rows = synthetic.generate(n, seed)
    labels = [topics(row, i) for i, row in enumerate(rows)]
    lines = [json.dumps({"text": row["premise"], "label": label}) for row, label in zip(rows, labels, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return labels
