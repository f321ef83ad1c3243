"""Data sources the data-source tests build."""

from __future__ import annotations

import random

import pandas as pd

POSITIVE = ["great", "wonderful", "superb", "moving", "brilliant", "charming"]

NEGATIVE = ["dull", "awful", "boring", "clumsy", "tedious", "bland"]


def sentiment_frame(n: int, seed: int) -> pd.DataFrame:
    """SST-2 style: one sentence whose adjective decides the label, string labels."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = rng.randrange(2)
        adjective = rng.choice(POSITIVE if label else NEGATIVE)
        subject = rng.choice(["film", "movie", "story", "plot", "cast"])
        sentence = f"the {subject} was {adjective} ."
        rows.append({"idx": i, "sentence": sentence, "label": ["negative", "positive"][label]})
    return pd.DataFrame(rows)
