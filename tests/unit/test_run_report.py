"""What a run tells its user, trained in the test process (engine single, tiny-bert): step lines with the elapsed
time and an ETA, the bar's postfix, the `wrote` line naming everything the run wrote, and the result line naming
the split and the chance level; the curves plot's panels."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from support.jobs import SMALL_JOB

from horovod_train.cli.main import main, result_line
from horovod_train.config.run_config import RunConfig, StepIntervals
from horovod_train.engines.single import SingleEngine
from horovod_train.outputs import run_directory
from horovod_train.outputs.trackers import Trackers, curves
from horovod_train.training import run_log
from horovod_train.training.parts import RunPlan
from horovod_train.training.position import TrainingPosition
from horovod_train.training.progress import Console

# 6 steps, a checkpoint every 2 of which rotation keeps the newest, a LoRA adapter, TensorBoard's directory.
JOB = ["train", "--engine", "single", *SMALL_JOB, "--synthetic_num_examples", "300", "--max_steps", "6"]
JOB += ["--logging_steps", "2", "--save_strategy", "steps", "--save_steps", "2", "--save_total_limit", "1"]
JOB += ["--use_peft", "--report_to", "tensorboard"]


@pytest.fixture(autouse=True)
def in_process(cache_dir, monkeypatch) -> None:
    monkeypatch.setenv("HOROVOD_TRAIN_CACHE", str(cache_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, cache_dir) -> tuple[Path, list[str]]:
    """A run's output directory and its stdout lines (under a launcher: no bar, a line per --logging_steps)."""
    out = tmp_path_factory.mktemp("report") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOROVOD_TRAIN_CACHE", str(cache_dir))
        patch.setenv("HF_HUB_OFFLINE", "1")
        captured = []
        patch.setattr(sys, "stdout", Capture(captured))
        assert main([*JOB, "--output_dir", str(out)]) == 0
    return out, "".join(captured).splitlines()


class Capture:
    """stdout as console.write_line uses it (module-scoped: capsys is per test)."""

    def __init__(self, into: list[str]) -> None:
        self.into = into

    def write(self, text: str) -> int:
        self.into.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_step_lines_carry_the_elapsed_time_and_an_eta(logged_run):
    _, lines = logged_run
    steps = [line for line in lines if line.startswith("step ")]
    pattern = r"step (\d)/6 epoch [\d.]+ loss [\d.]+ lr [\d.e+-]+ [\d.]+ samples/s elapsed (\d\d:\d\d) eta (\S+)"
    found = [re.fullmatch(pattern, line) for line in steps]
    assert all(found) and [m[1] for m in found] == ["2", "4", "6"], steps
    assert found[-1][3] == "00:00", steps  # nothing left at the last step


def test_the_eta_is_the_pace_since_the_loop_started_times_the_steps_left(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(run_log.time, "perf_counter", lambda: clock[0])
    engine = SingleEngine(RunConfig())
    plan = RunPlan(steps_per_epoch=40, num_epochs=1, total_steps=40, global_batch=8, intervals=StepIntervals(1, 1, 0))
    log = run_log.RunLog(engine, run_directory.RunDirectory(tmp_path), Trackers({}), Console(engine), plan)
    clock[0] = 130.0  # setup's end to the loop's start (a resumed run enters at its step)
    log.enter(TrainingPosition(global_step=10, total_steps=40))
    clock[0] = 150.0
    assert log.timing(TrainingPosition(global_step=20, total_steps=40)) == "elapsed 00:50 eta 00:40"
    assert log.timing(TrainingPosition(global_step=10, total_steps=40)) == "elapsed 00:50 eta ?"


def test_the_wrote_line_names_everything_the_run_wrote_and_nothing_else(logged_run):
    out, lines = logged_run
    (wrote,) = [line for line in lines if line.startswith("wrote ")]
    names = wrote.removeprefix(f"wrote {out}/: ").split(", ")
    on_disk = {p.name + ("/" if p.is_dir() else "") for p in out.iterdir()} - {run_directory.RunFiles.LEDGER}
    assert sorted(names) == sorted(on_disk), wrote
    assert {"checkpoint-6/", "adapter/", "runs/", "training_curves.png", "model.safetensors"} <= set(names)
    assert "checkpoint-2/" not in names  # rotated away


def test_the_last_steps_checkpoint_is_saved_once_after_the_epochs_end(logged_run):
    """--save_steps 2 of 6 steps: a save at steps 2, 4 and 6, the last one after the epoch's end (its history entry),
    not also before it: a save numbers itself one past the newest in place, a second of checkpoint-6 would be 4."""
    out, _ = logged_run
    state = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["save_sequence"] == 3, state["save_sequence"]
    assert state["history"][-1]["step"] == 6


def test_the_run_writes_a_model_card_as_the_trainer_does(logged_run):
    """README.md in the output directory, as transformers' create_model_card writes it (issue 58): the model, the
    data, the evaluation's results, the hyperparameters, a row per evaluation."""
    out, _ = logged_run
    card = (out / "README.md").read_text()
    results = json.loads((out / "all_results.json").read_text())
    assert card.startswith("---\nlibrary_name: transformers\n") and "\n# run\n" in card
    assert "This model was trained from scratch on the synthetic-nli dataset." in card
    assert f"- Accuracy: {round(results['eval_accuracy'], 4)}\n" in card
    config = json.loads((out / "run_config.json").read_text())
    assert f"- learning_rate: {config['learning_rate']}\n- train_batch_size: 16\n" in card
    assert "- engine: single\n- num_devices: 1\n" in card
    assert "- training_steps: 6\n" in card
    table = card.split("### Training results\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert table[0].startswith("| Training Loss | Epoch  | Step | Validation Loss | Accuracy |") and len(table) == 3


def test_the_result_line_is_last_and_names_the_split_and_chance(logged_run):
    out, lines = logged_run
    results = json.loads((out / "all_results.json").read_text())
    assert (results["problem_type"], results["num_labels"], results["validation_split"]) == (
        "single_label_classification",
        3,
        "validation",
    )
    accuracy, f1, examples = results["eval_accuracy"], results["eval_f1"], results["eval_samples"]
    expected = f"validation accuracy {accuracy:.4f} (f1 {f1:.4f}, {examples} examples; chance 0.33); single"
    assert lines[-1].startswith(expected), lines[-3:]


def test_the_bar_shows_the_learning_rate_and_samples_per_second(tmp_path, monkeypatch, capsys):
    """At a terminal (stderr a tty): the bar, whose postfix has what the log lines say besides the loss."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    job = [arg for arg in JOB if arg != "--disable_tqdm"]
    assert main([*job, "--output_dir", str(tmp_path / "run")]) == 0
    bar = capsys.readouterr().err
    assert re.search(r"loss=[\d.]+, lr=[\d.e+-]+, samples/s=[\d.]+", bar), bar[-500:]


RESULTS = {"eval_samples": 40, "engine": "single", "world_size": 1, "wall_time_s": 2.0}


@pytest.mark.parametrize(
    ("task", "metrics", "shown"),
    [
        (
            {"problem_type": "single_label_classification", "num_labels": 3, "validation_split": "validation_matched"},
            {
                "eval_accuracy": 0.5,
                "eval_validation_mismatched_accuracy": 0.25,
                "eval_validation_mismatched_samples": 8,
            },
            "validation_matched accuracy 0.5000 (40 examples; chance 0.33), "
            "validation_mismatched accuracy 0.2500 (8 examples; chance 0.33)",
        ),
        (
            {"problem_type": "single_label_classification", "num_labels": 2, "validation_split": "validation"},
            {"eval_matthews_correlation": 0.5},  # cola: chance is a statement about accuracy
            "validation matthews_correlation 0.5000 (40 examples)",
        ),
        (
            {"problem_type": "regression", "num_labels": 1, "validation_split": "validation"},
            {"eval_pearson": 0.9, "eval_spearmanr": 0.8},
            "validation pearson 0.9000 (spearmanr 0.8000, 40 examples)",
        ),
        (
            {"problem_type": "multi_label_classification", "num_labels": 4, "validation_split": "validation"},
            {"eval_accuracy": 0.5},  # subset accuracy: 1/num_labels is not its chance level
            "validation accuracy 0.5000 (40 examples)",
        ),
        ({}, {"eval_accuracy": 0.5}, "validation accuracy 0.5000 (40 examples)"),  # results of an older run
    ],
)
def test_result_line_per_task_shape(task, metrics, shown):
    assert result_line({**RESULTS, **task, **metrics}) == f"{shown}; single, world size 1, 2.0s"


def test_each_log_line_records_the_last_steps_gradient_norm_as_hfs_trainer_names_it(logged_run):
    """grad_norm in trainer_state.json's log_history, metrics.jsonl and TensorBoard (train/grad_norm), plotted."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = logged_run
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    training = [entry for entry in history if "loss" in entry]
    assert [e["step"] for e in training] == [2, 4, 6] and all(e["grad_norm"] > 0 for e in training), training
    records = [json.loads(line) for line in (out / run_directory.RunFiles.METRICS).read_text().splitlines()]
    assert [r["grad_norm"] for r in records] == [e["grad_norm"] for e in training]
    (board,) = (out / "runs").iterdir()
    events = EventAccumulator(str(board)).Reload()
    assert [round(e.value, 5) for e in events.Scalars("train/grad_norm")] == [
        round(e["grad_norm"], 5) for e in training
    ]
    assert list(curves(history))[:3] == ["loss", "grad_norm", "learning_rate"]


def test_the_curves_have_the_learning_rate_and_no_count_panels():
    history = [
        {"loss": 1.1, "learning_rate": 2e-4, "epoch": 0.5, "step": 10},
        {"eval_loss": 1.0, "eval_accuracy": 0.4, "eval_samples": 40, "eval_validation_mismatched_accuracy": 0.3,
         "eval_validation_mismatched_samples": 50, "eval_runtime": 1.5, "eval_samples_per_second": 26.7,
         "epoch": 1.0, "step": 20},
        {"train_loss": 1.05, "train_runtime": 9.0, "train_samples": 300, "epoch": 1.0, "step": 20},
    ]  # fmt: skip
    assert list(curves(history)) == ["loss", "learning_rate", "eval_loss", "eval_accuracy",
                                     "eval_validation_mismatched_accuracy"]  # fmt: skip
