"""Trackers (tensorboard, wandb offline, mlflow file store) and the training-curves plot: fast, no network."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.trackers import CONFIG, log_all, offline_trackers

from horovod_train.outputs.trackers import Trackers

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_missing_package_message_on_the_command_line(tmp_path, name):
    """What a user without the package sees: one stderr line and exit code 2 (run with the package blocked)."""
    script = textwrap.dedent(f"""
        import sys
        sys.modules[{name!r}] = None
        from horovod_train.common.errors import UsageError, exit_with
        from horovod_train.outputs.trackers import Trackers
        try:
            Trackers.create({name!r}, output_dir={str(tmp_path)!r})
        except UsageError as error:
            exit_with(error)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"error: --report_to {name} needs the {name} package (not installed); "
        f"fix: pip install {name}, or drop {name} from --report_to"
    ]


def test_mlflow_file_store(tmp_path, monkeypatch):
    import mlflow

    offline_trackers(tmp_path, monkeypatch)
    config = {**CONFIG, **{f"p{i}": i for i in range(150)}, "long": "x" * 800}  # over one batch, over 500 chars
    trackers = Trackers.create("mlflow", output_dir=tmp_path / "out", run_name="my-run", config=config)
    run_id = trackers.trackers["mlflow"].run.info.run_id
    log_all(trackers)
    trackers.log({"eval_acc@top(1)": 0.5}, step=30)  # after close: nothing, no error
    client = mlflow.tracking.MlflowClient()
    run = client.get_run(run_id)
    assert run.info.run_name == "my-run" and run.info.status == "FINISHED"
    assert len(run.data.params) == len(config) and run.data.params["long"] == "x" * 500
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(10, 0.69), (20, 0.41)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval_accuracy")] == [(20, 0.8)]
    assert "note" not in run.data.metrics


# `--report_to all` from a two-rank horovodrun run (rank 0 alone feeds each tracker once): test_best_model.py's job,
# one launch for both.
