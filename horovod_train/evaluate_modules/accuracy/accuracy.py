"""Accuracy as an `evaluate` metric module, shipped with the package so evaluation works offline.

Same inputs and output as the hub's "accuracy" metric (predictions, references, normalize,
sample_weight), computed with numpy instead of scikit-learn.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Accuracy is the proportion of correct predictions among the total number of cases processed."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted labels.
    references (list of int): ground truth labels.
    normalize (bool): if False, return the number of correct predictions. Defaults to True.
    sample_weight (list of float): sample weights. Defaults to None.
Returns:
    accuracy (float or int)
"""
_CITATION = ""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}),
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        correct = np.asarray(predictions) == np.asarray(references)
        weights = np.ones(len(correct)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        hits = float((correct * weights).sum())
        if normalize:
            return {"accuracy": hits / float(weights.sum())}
        return {"accuracy": int(hits) if sample_weight is None else hits}
