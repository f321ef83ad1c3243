"""Shared by the tracker tests."""

from __future__ import annotations

from pathlib import Path

from horovod_train.outputs.trackers import Trackers

CONFIG = {"learning_rate": 5e-5, "seed": 42, "model_name_or_path": "tiny-bert", "dropout": None}

TRAIN = [(10, {"loss": 0.69, "learning_rate": 5e-5, "samples_per_second": 120.0, "epoch": 0.5, "note": "warm"}),
         (20, {"loss": 0.41, "learning_rate": 2.5e-5, "samples_per_second": 125.0, "epoch": 1.0})]  # fmt: skip

EVAL = (20, {"eval_accuracy": 0.8, "eval_loss": 0.5, "eval_f1": 0.79})


def log_all(trackers: Trackers) -> None:
    for step, record in [*TRAIN, EVAL]:
        trackers.log(record, step=step)
    trackers.close()


def offline_trackers(tmp_path: Path, monkeypatch) -> None:
    """wandb offline and mlflow on a file store, both under tmp_path (wandb and mlflow-skinny are dev
    requirements, so these tests run in every `make test`)."""
    for key in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):  # keep wandb's own logs out of ~
        monkeypatch.setenv(key, str(tmp_path / key.lower()))
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb-dir"),
        "WANDB_SILENT": "true",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_PROJECT": "hvt-test",
        "MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri(),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_ALLOW_FILE_STORE": "true",
    }.items():  # fmt: skip  (mlflow 3.17 wants the last)
        monkeypatch.setenv(key, value)
