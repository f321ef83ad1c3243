"""Trackers (tensorboard, wandb offline, mlflow file store) and the training-curves plot: fast, no network."""

from __future__ import annotations

import io
import sys

import pytest
from support.trackers import CONFIG, EVAL, TRAIN, log_all, offline_trackers

from horovod_train.common.errors import UsageError
from horovod_train.outputs.trackers import Trackers, check_report_to, curves_png


def test_tensorboard_writes_hf_style_tags(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_all(Trackers.create("tensorboard", output_dir=tmp_path, run_name="my-run", config=CONFIG))
    events = EventAccumulator(str(tmp_path / "runs" / "my-run"))
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert set(scalars) == {
        *(f"train/{k}" for k in ("loss", "learning_rate", "samples_per_second", "epoch")),
        *(f"eval/{k}" for k in ("accuracy", "loss", "f1")),
    }  # the string "note" is skipped
    assert scalars["train/loss"] == [(10, pytest.approx(0.69)), (20, pytest.approx(0.41))]
    assert scalars["eval/accuracy"] == [(20, pytest.approx(0.8))]
    config_text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"model_name_or_path": "tiny-bert"' in config_text


@pytest.mark.parametrize("value", ["none", "", " NONE ", "None,"])
def test_none_means_no_tracker_and_writes_nothing(tmp_path, value):
    assert check_report_to(value) == []
    trackers = Trackers.create(value, output_dir=tmp_path / "out", config=CONFIG)
    log_all(trackers)
    assert trackers.trackers == {} and not (tmp_path / "out").exists()


def test_names_are_validated(monkeypatch):
    assert check_report_to("TensorBoard, tensorboard") == ["tensorboard"]
    for name in ("wandb", "mlflow"):
        monkeypatch.setitem(sys.modules, name, None)
    assert check_report_to("all") == ["tensorboard"]  # only what is installed
    with pytest.raises(UsageError, match="unknown tracker 'neptune'") as error:
        check_report_to("tensorboard,neptune")
    assert "tensorboard, wandb, mlflow, all or none" in error.value.fix
    with pytest.raises(UsageError, match="stand alone"):
        check_report_to("none,tensorboard")


@pytest.mark.parametrize("name", ["tensorboard", "wandb", "mlflow"])
def test_missing_package_is_a_one_line_usage_error(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(UsageError) as error:
        Trackers.create(f"tensorboard,{name}", output_dir=tmp_path / "out")
    assert error.value.problem == f"--report_to {name} needs the {name} package (not installed)"
    assert error.value.fix == f"pip install {name}, or drop {name} from --report_to"
    assert not (tmp_path / "out").exists()  # validated before any tracker was started


def test_wandb_offline(tmp_path, monkeypatch):
    offline_trackers(tmp_path, monkeypatch)
    log_all(Trackers.create("wandb", output_dir=tmp_path / "out", run_name="my-run", config=CONFIG))
    runs = list((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), runs


def test_curves_png(tmp_path):
    import matplotlib.image

    history = [{**record, "step": step} for step, record in [*TRAIN, EVAL]]
    history.append({"eval_accuracy": 0.85, "eval_loss": 0.45, "eval_runtime": 1.2, "step": 40})
    png = curves_png(history)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(io.BytesIO(png))
    assert image.shape[0] > 400 and image.shape[1] > 400 and image.std() > 0.01  # 4 panels, not blank


@pytest.mark.parametrize("history", [[], [{"step": 1, "epoch": 0.1}], [{"loss": 0.5}], [{"step": 2, "loss": "nan?"}]])
def test_curves_without_points_are_none(history):
    assert curves_png(history) is None


def test_the_curves_name_the_run_and_show_accuracy_from_0_to_1_against_chance():
    """Issue 58: a title naming the run, engine and world size; the accuracy axis fixed at 0..1 (it auto-zoomed)
    with the chance line."""
    from horovod_train.outputs.trackers import curves_figure

    history = [{**record, "step": step} for step, record in [*TRAIN, EVAL]]
    history.append({"eval_accuracy": 0.41, "eval_f1": 0.4, "eval_loss": 1.05, "step": 40})
    fig = curves_figure(history, title="mnli-run: horovod, world size 2", chance=1 / 3)
    assert fig._suptitle.get_text() == "mnli-run: horovod, world size 2"
    panels = {ax.get_ylabel(): ax for ax in fig.axes}
    for name in ("eval_accuracy", "eval_f1"):
        assert panels[name].get_ylim() == (0.0, 1.0), name
    chance = [line for line in panels["eval_accuracy"].lines if list(line.get_ydata()) == [1 / 3, 1 / 3]]
    assert len(chance) == 1 and chance[0].get_label() == "chance 0.33"
    assert panels["train loss"].get_ylim() != (0.0, 1.0)  # the loss keeps its own scale
