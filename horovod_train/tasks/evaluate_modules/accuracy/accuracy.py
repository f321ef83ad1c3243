"""Accuracy as an `evaluate` metric module, shipped with the package so evaluation works offline.

The hub's "accuracy" metric, offline: the same inputs and output (predictions, references, normalize,
sample_weight), computed as the hub's is, by scikit-learn's accuracy_score, through the one accuracy the runs
score with (horovod_train.tasks.scores.accuracy).
"""

import datasets
import evaluate

from horovod_train.tasks.scores import accuracy

_DESCRIPTION = "Accuracy is the proportion of correct predictions among the total number of cases processed."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted labels.
    references (list of int): ground truth labels.
    normalize (bool): if False, return the number of correct predictions. Defaults to True.
    sample_weight (list of float): sample weights. Defaults to None.
Returns:
    accuracy (float)
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
        return {"accuracy": accuracy(predictions, references, normalize=normalize, sample_weight=sample_weight)}
