"""The metrics a shape names, by name: run_glue's (and a multi-label's and a custom regression's), by scikit-learn
and scipy (transformers' run_glue computes them with the same functions through evaluate's glue metric); a custom
dataset's classification through evaluate's modules shipped with the package."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType

import numpy as np

METRIC_MODULES = Path(__file__).parent.parent / "evaluate_modules"


def _sklearn() -> ModuleType:
    import sklearn.metrics  # imported when first scored: the command line starts without it

    return sklearn.metrics


def _scipy() -> ModuleType:
    import scipy.stats

    return scipy.stats


# Each metric of (predictions, references), in example order.
METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": lambda p, r: _sklearn().accuracy_score(r, p),  # subset accuracy for multi-hot rows
    "f1": lambda p, r: _sklearn().f1_score(r, p),  # the positive class (label 1), as run_glue
    "matthews_correlation": lambda p, r: _sklearn().matthews_corrcoef(r, p),
    "f1_micro": lambda p, r: _sklearn().f1_score(r, p, average="micro", zero_division=0),
    "f1_macro": lambda p, r: _sklearn().f1_score(r, p, average="macro", zero_division=0),
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
    import evaluate

    # Shipped with the package: evaluate.load("accuracy") would fetch the script from the hub.
    return evaluate.load(str(METRIC_MODULES / name), keep_in_memory=True)


def custom_classification_scores(predictions: list, references: list) -> dict[str, float]:
    """A custom dataset's accuracy and macro F1, by evaluate's modules (as before run_glue's metrics came)."""
    accuracy = metric_module("accuracy").compute(predictions=predictions, references=references)["accuracy"]
    f1 = metric_module("f1").compute(predictions=predictions, references=references, average="macro")["f1"]
    return {"accuracy": float(accuracy), "f1": float(f1)}
