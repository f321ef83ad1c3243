"""Experiment trackers fed from rank 0, named as in transformers' ``--report_to``; and the training-curves plot.

- tensorboard: event files in ``<output_dir>/runs/<run_name or "run">/`` (HF's Trainer also logs under
  ``output_dir/runs``): ``tensorboard --logdir <output_dir>/runs``.
- wandb: project ``$WANDB_PROJECT`` (default horovod-train), local files in ``$WANDB_DIR`` or ``<output_dir>/wandb/``;
  ``WANDB_MODE=offline`` and wandb's other variables apply.
- mlflow: the store or server of ``$MLFLOW_TRACKING_URI`` (experiment ``$MLFLOW_EXPERIMENT_NAME`` if set).

tensorboard and wandb get HF's tag names (``loss`` -> ``train/loss``, ``eval_accuracy`` -> ``eval/accuracy``), mlflow
the plain keys, as HF's callbacks do.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import numbers
import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from horovod_train.common.errors import UsageError

TRACKERS = ("tensorboard", "wandb", "mlflow")  # each is also the name of the package it needs
MLFLOW_PARAM_LIMIT = 500  # characters per value; older mlflow servers reject longer ones
MLFLOW_BATCH = 100  # params per log_params call (mlflow's per-request limit)
MLFLOW_BAD_CHARS = re.compile(r"[^0-9A-Za-z_\-./ ]")  # mlflow rejects names with any other character
# The training records' curves (HF's log names), in panel order.
TRAINING_CURVES = ("loss", "grad_norm", "learning_rate")
# An evaluation's example counts and speeds (eval_samples, eval_<split>_samples, eval_runtime, ...): a flat or
# noisy line about the machine, not the model, so the curves plot leaves them out.
EVAL_COUNT_AND_SPEED_ENDINGS = ("_samples", "_runtime", "_samples_per_second", "_steps_per_second")


def check_report_to(report_to: str) -> list[str]:
    """The tracker names in ``report_to``, validated; creates nothing."""
    names = list(dict.fromkeys(name.strip().lower() for name in (report_to or "").split(",") if name.strip()))
    for name in names:
        if name not in (*TRACKERS, "none", "all"):
            raise UsageError(f"--report_to: unknown tracker {name!r}", f"use {', '.join(TRACKERS)}, all or none")
    if len(names) > 1 and {"none", "all"} & set(names):
        raise UsageError(f"--report_to {report_to}: none and all stand alone", "give none, all, or a list of trackers")
    if names in ([], ["none"]):
        return []
    if names == ["all"]:
        return [name for name in TRACKERS if importlib.util.find_spec(name)]
    # find_spec is None also for a package blocked with sys.modules[name] = None.
    for name in (name for name in names if importlib.util.find_spec(name) is None):
        problem = f"--report_to {name} needs the {name} package (not installed)"
        raise UsageError(problem, f"pip install {name}, or drop {name} from --report_to")
    return names


def numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}


def rewrite_logs(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """HF's tag names: eval_x -> eval/x, test_x -> test/x, anything else -> train/x."""
    prefixed = re.compile(r"^(eval|test)_")
    return {prefixed.sub(r"\1/", k) if prefixed.match(k) else f"train/{k}": v for k, v in metrics.items()}


class TensorBoardTracker:
    def __init__(self, output_dir: Path, run_name: str | None, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(output_dir / "runs" / (run_name or "run")))
        # Indented four spaces: TensorBoard renders text as markdown, and this keeps the JSON a code block.
        self.writer.add_text("config", textwrap.indent(json.dumps(config, indent=2, default=str), "    "))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for tag, value in rewrite_logs(numeric(metrics)).items():
            self.writer.add_scalar(tag, value, global_step=step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbTracker:
    def __init__(self, output_dir: Path, run_name: str | None, config: Mapping[str, Any]) -> None:
        import wandb

        local_dir = Path(os.environ.get("WANDB_DIR") or output_dir)
        local_dir.mkdir(parents=True, exist_ok=True)  # wandb falls back to a temp dir if it is missing
        project = os.environ.get("WANDB_PROJECT", "horovod-train")
        self.run = wandb.init(project=project, name=run_name, config=dict(config), dir=str(local_dir))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log(rewrite_logs(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MLflowTracker:
    def __init__(self, output_dir: Path, run_name: str | None, config: Mapping[str, Any]) -> None:
        import mlflow

        self.mlflow = mlflow
        self.run = mlflow.start_run(run_name=run_name)
        params = [(MLFLOW_BAD_CHARS.sub("_", k), str(v)[:MLFLOW_PARAM_LIMIT]) for k, v in config.items()]
        for start in range(0, len(params), MLFLOW_BATCH):
            mlflow.log_params(dict(params[start : start + MLFLOW_BATCH]))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.mlflow.log_metrics({MLFLOW_BAD_CHARS.sub("_", k): v for k, v in numeric(metrics).items()}, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


Tracker = TensorBoardTracker | WandbTracker | MLflowTracker
TRACKER_CLASSES = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MLflowTracker}


class Trackers:
    """The trackers of one run (rank 0 only): ``log`` feeds every one, ``close`` finishes them."""

    def __init__(self, trackers: Mapping[str, Tracker]) -> None:
        self.trackers = dict(trackers)

    @classmethod
    def create(
        cls, report_to: str, output_dir: Path, run_name: str | None = None, config: Mapping[str, Any] | None = None
    ) -> Trackers:
        created: dict[str, Tracker] = {}
        try:
            for name in check_report_to(report_to):
                created[name] = TRACKER_CLASSES[name](Path(output_dir), run_name, config or {})
        except BaseException:
            cls(created).close()  # do not leave a started wandb/mlflow run behind
            raise
        return cls(created)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for tracker in self.trackers.values():
            tracker.log(metrics, step)

    def close(self) -> None:
        trackers, self.trackers = self.trackers, {}  # a second close is a no-op
        for tracker in trackers.values():
            tracker.close()


def plotted(key: str) -> bool:
    """The training loss, gradient norm and learning rate, and each evaluation metric (not its counts and speeds)."""
    return key in TRAINING_CURVES or (key.startswith("eval_") and not key.endswith(EVAL_COUNT_AND_SPEED_ENDINGS))


def curves(log_history: Sequence[Mapping[str, Any]]) -> dict[str, tuple[list[float], list[float]]]:
    """Finite (step, value) points per key: the training loss, the gradient norm, the learning rate, then
    eval_loss, eval_accuracy, other eval metrics."""
    points: dict[str, tuple[list[float], list[float]]] = {}
    for record in (r for r in log_history if isinstance(r.get("step"), numbers.Real)):
        for key, value in numeric(record).items():
            if plotted(key) and math.isfinite(value):
                steps, values = points.setdefault(key, ([], []))
                steps.append(float(record["step"]))
                values.append(value)
    first = [*TRAINING_CURVES, "eval_loss", "eval_accuracy"]
    return {k: points[k] for k in sorted(points, key=lambda k: (first.index(k) if k in first else len(first), k))}


# Metrics whose values lie in [0, 1]: their panels keep that axis, so that runs compare at a glance and a flat line
# near chance does not look like progress.
UNIT_INTERVAL = re.compile(r"^eval_(\w+_)?(accuracy|f1(_micro|_macro)?)$")


def curves_png(
    log_history: Sequence[Mapping[str, Any]], title: str | None = None, chance: float | None = None
) -> bytes | None:
    """The curves (``curves_figure``) as a PNG's bytes, for the run directory to write; None if there are no points."""
    fig = curves_figure(log_history, title, chance)
    if fig is None:
        return None
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=100)
    return image.getvalue()


def curves_figure(log_history: Sequence[Mapping[str, Any]], title: str | None = None, chance: float | None = None):
    """One panel per curve over steps (a matplotlib Figure), None if no points. ``title``: the run's (its name,
    engine and world size); ``chance``: the accuracy of a uniform guess, a line on each accuracy panel."""
    series = curves(log_history)
    if not series:
        return None
    # The object-oriented API draws with Agg and leaves pyplot's global backend and figures alone.
    from matplotlib.figure import Figure

    # Margins in inches, not a layout engine: constrained layout measured every tick label first, twice the
    # drawing's CPU, paid at the end of every run.
    top = 0.45 if title else 0.15
    height = 2.4 * len(series) + top - 0.15
    fig = Figure(figsize=(7, height))
    fig.subplots_adjust(left=1.0 / 7, right=1 - 0.2 / 7, bottom=0.55 / height, top=1 - top / height, hspace=0.12)
    if title:
        fig.suptitle(title, y=1 - 0.08 / height, va="top", fontsize=11)
    axes = fig.subplots(len(series), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (key, (steps, values)) in zip(axes, series.items(), strict=True):
        ax.plot(steps, values, marker="o" if len(steps) <= 30 else None)
        ax.set_ylabel(
            {"loss": "train loss", "grad_norm": "gradient norm", "learning_rate": "learning rate"}.get(key, key)
        )
        ax.grid(alpha=0.3)
        if UNIT_INTERVAL.match(key):
            ax.set_ylim(0, 1)
            if chance is not None and key.endswith("accuracy"):
                ax.axhline(chance, color="gray", linestyle="--", linewidth=1, label=f"chance {chance:.2g}")
                ax.legend(loc="lower right", fontsize=8)
    axes[-1].set_xlabel("step")
    return fig
