"""The metrics a shape names, by name: run_glue's (and a multi-label's and a custom dataset's), by scikit-learn
and scipy (transformers' run_glue computes them with the same functions through evaluate's glue metric). Each
metric has this one implementation: the `evaluate` modules shipped with the package (evaluate_modules/: what
``evaluate.load("accuracy")`` and ``evaluate.load("f1")`` fetch from the hub, which wrap scikit-learn too) call
``accuracy`` and ``f1`` here."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

METRIC_MODULES = Path(__file__).parent / "evaluate_modules"


def _sklearn() -> ModuleType:
    import sklearn.metrics  # imported when first scored: the command line starts without it

    return sklearn.metrics


def _scipy() -> ModuleType:
    import scipy.stats

    return scipy.stats


def accuracy(predictions: Any, references: Any, **options: Any) -> float:
    """scikit-learn's accuracy_score (subset accuracy for multi-hot rows), with its options (normalize,
    sample_weight): the run's accuracy and the shipped `evaluate` module's."""
    return float(_sklearn().accuracy_score(references, predictions, **options))


def f1(predictions: Any, references: Any, **options: Any) -> Any:
    """scikit-learn's f1_score with its options (labels, pos_label, average, sample_weight, zero_division): the
    positive class's by default (average="binary"); an array of one per label with average=None."""
    return _sklearn().f1_score(references, predictions, **options)


# Each metric of (predictions, references), in example order.
METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "f1": f1,  # the positive class (label 1), as run_glue
    "matthews_correlation": lambda p, r: _sklearn().matthews_corrcoef(r, p),
    "f1_micro": partial(f1, average="micro", zero_division=0),
    "f1_macro": partial(f1, average="macro", zero_division=0),  # over the labels predicted or true
    "mse": lambda p, r: _sklearn().mean_squared_error(r, p),
    "pearson": lambda p, r: _scipy().pearsonr(p, r)[0],
    "spearmanr": lambda p, r: _scipy().spearmanr(p, r)[0],
}
METRIC_NAMES = (*METRICS, "combined_score")  # every metric an evaluation may report, for display


def scores(names: tuple[str, ...], predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
    """The named metrics; ``combined_score``: the mean of the others (run_glue's, for a task with two)."""
    with warnings.catch_warnings():  # constant predictions (early in training): the correlation is nan
        warnings.simplefilter("ignore")
        found = {name: float(METRICS[name](predictions, references)) for name in names if name != "combined_score"}
    if "combined_score" in names:
        found["combined_score"] = float(np.mean(list(found.values())))
    return found


@cache
def metric_module(name: str):
    """A shipped `evaluate` module, loaded as ``evaluate.load`` loads one (its numbers are ``METRICS``')."""
    import evaluate

    # Shipped with the package: evaluate.load("accuracy") would fetch the script from the hub.
    return evaluate.load(str(METRIC_MODULES / name), keep_in_memory=True)


def custom_classification_scores(predictions: Any, references: Any) -> dict[str, float]:
    """A custom dataset's accuracy and F1, macro-averaged over its classes (what evaluate's "accuracy" and "f1"
    modules give it, as they did before run_glue's metrics came)."""
    found = scores(("accuracy", "f1_macro"), np.asarray(predictions), np.asarray(references))
    return {"accuracy": found["accuracy"], "f1": found["f1_macro"]}
