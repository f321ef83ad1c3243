"""Metrics recomputed in one process from a run's saved model, to check what the ranks reported."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from transformers.trainer_pt_utils import LabelSmoother

from horovod_train.config.run_config import DataArguments
from horovod_train.data.splits import load_raw_datasets


def recompute_metrics(
    output_dir: Path, data_args: DataArguments, seed: int, label_smoothing: float = 0.0
) -> dict[str, float]:
    """Single process, from the saved model alone: the numbers every rank should have reported
    (accuracy, macro F1 computed here from the confusion counts, mean cross-entropy, label-smoothed
    by transformers' own LabelSmoother when asked)."""
    validation = load_raw_datasets(data_args, seed)["validation"]
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    model = AutoModelForSequenceClassification.from_pretrained(output_dir).eval()
    predictions, losses = [], []
    with torch.no_grad():
        for start in range(0, len(validation), 64):
            rows = validation[start : start + 64]
            batch = tokenizer(rows["premise"], rows["hypothesis"], padding=True, return_tensors="pt")
            logits = model(**batch).logits
            predictions += logits.argmax(-1).tolist()
            labels = torch.tensor(rows["label"])
            if label_smoothing:  # the smoother returns the batch mean
                losses += [LabelSmoother(label_smoothing)({"logits": logits}, labels).item()] * len(labels)
            else:
                losses += torch.nn.functional.cross_entropy(logits, labels, reduction="none").tolist()
    labels = validation["label"]
    f1s = []
    for c in sorted(set(labels) | set(predictions)):
        tp = sum(p == y == c for p, y in zip(predictions, labels, strict=True))
        predicted, actual = predictions.count(c), labels.count(c)
        f1s.append(2 * tp / (predicted + actual) if predicted + actual else 0.0)
    accuracy = sum(p == y for p, y in zip(predictions, labels, strict=True)) / len(labels)
    return {"accuracy": accuracy, "f1": sum(f1s) / len(f1s), "loss": sum(losses) / len(losses), "n": len(labels)}
