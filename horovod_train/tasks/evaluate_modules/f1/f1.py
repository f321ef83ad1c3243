"""F1 as an `evaluate` metric module, shipped with the package so evaluation works offline.

The hub's "f1" metric, offline: the same inputs and output (predictions, references, labels, pos_label,
average, sample_weight), computed as the hub's is, by scikit-learn's f1_score, through the one F1 the runs
score with (horovod_train.tasks.scores.f1).
"""

import datasets
import evaluate
import numpy as np

from horovod_train.tasks.scores import f1

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
        score = f1(predictions, references, labels=labels, pos_label=pos_label, average=average,
                   sample_weight=sample_weight)  # fmt: skip
        return {"f1": float(score) if np.size(score) == 1 else score}
