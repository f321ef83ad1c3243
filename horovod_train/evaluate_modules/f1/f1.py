"""F1 as an `evaluate` metric module, shipped with the package so evaluation works offline.

Same inputs and output as the hub's "f1" metric (predictions, references, labels, pos_label, average,
sample_weight), computed with numpy instead of scikit-learn. A class with no true and no predicted
example scores 0, as scikit-learn's zero_division default does (with a warning there).
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "F1 is the harmonic mean of precision and recall: 2 * precision * recall / (precision + recall)."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted labels.
    references (list of int): ground truth labels.
    labels (list of int): the labels to include with average != 'binary'. Defaults to the labels present.
    pos_label (int): the positive class with average='binary'. Defaults to 1.
    average (str): 'binary' (default), 'micro', 'macro', 'weighted' or None (one score per label).
    sample_weight (list of float): sample weights. Defaults to None.
Returns:
    f1 (float, or array of float with average=None)
"""
_CITATION = ""


def _per_label(predictions, references, weights, labels):
    tp = np.array([weights[(predictions == c) & (references == c)].sum() for c in labels])
    predicted = np.array([weights[predictions == c].sum() for c in labels])
    actual = np.array([weights[references == c].sum() for c in labels])
    return tp, predicted, actual


def _f1(tp, predicted, actual):
    denominator = predicted + actual
    return np.divide(2 * tp, denominator, out=np.zeros_like(tp, dtype=float), where=denominator > 0)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class F1(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}),
        )

    def _compute(self, predictions, references, labels=None, pos_label=1, average="binary", sample_weight=None):
        predictions, references = np.asarray(predictions), np.asarray(references)
        weights = np.ones(len(predictions)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        if average == "binary":
            labels = [pos_label]
        elif labels is None:
            labels = sorted(set(predictions.tolist()) | set(references.tolist()))
        tp, predicted, actual = _per_label(predictions, references, weights, labels)
        if average == "micro":
            score = _f1(np.array([tp.sum()]), np.array([predicted.sum()]), np.array([actual.sum()]))[0]
        elif average is None:
            return {"f1": _f1(tp, predicted, actual)}
        elif average == "weighted":
            score = float((_f1(tp, predicted, actual) * actual).sum() / max(actual.sum(), 1e-300))
        elif average in ("binary", "macro"):
            score = _f1(tp, predicted, actual).mean()
        else:
            raise ValueError(f"unknown average {average!r}: use binary, micro, macro, weighted or None")
        return {"f1": float(score)}
