"""The loop's policies: when a run is finished, where the learning rate stands, where a resumed run
starts; and the loop obeying whatever policy its engine supplies."""

from __future__ import annotations

import json

import pytest
import torch
from support.jobs import SMALL_JOB

from horovod_train.config.parsing import parse_run_config
from horovod_train.engines.policy import RunPolicy
from horovod_train.engines.single import SingleEngine
from horovod_train.training.position import TrainingPosition
from horovod_train.training.trainer import Trainer


def config(tmp_path, *args: str):
    return parse_run_config([*SMALL_JOB, "--engine", "single", "--synthetic_num_examples", "600",
                             "--output_dir", str(tmp_path / "run"), *args])  # fmt: skip


@pytest.fixture
def offline_cache(cache_dir, monkeypatch):
    monkeypatch.setenv("HOROVOD_TRAIN_CACHE", str(cache_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def train(run_config) -> tuple[Trainer, dict]:
    engine = SingleEngine(run_config)
    with engine.running():
        trainer = Trainer(run_config, engine)
        return trainer, trainer.train()


def test_resumed_run_starts_at_the_checkpoint_position_with_its_learning_rate(tmp_path, offline_cache):
    train(config(tmp_path, "--max_steps", "6", "--save_steps", "3", "--warmup_steps", "2"))
    resumed = config(tmp_path, "--max_steps", "6", "--warmup_steps", "2", "--resume_from_checkpoint",
                     str(tmp_path / "run" / "checkpoint-3"))  # fmt: skip
    engine = SingleEngine(resumed)
    with engine.running():
        loop = Trainer(resumed, engine).setup()
        loop.enter(loop.position)
        position = loop.position
        assert (position.global_step, position.epoch, position.steps_in_epoch) == (3, 0, 3)
        assert position.samples_in_epoch == 3 * 16 and position.total_steps == 6
        expected_lr = resumed.training.learning_rate * (6 - 3) / (6 - 2)
        assert loop.parts.optimizer.param_groups[0]["lr"] == pytest.approx(expected_lr, rel=1e-12)


class StopAtFive(RunPolicy):
    def finished(self, position: TrainingPosition) -> bool:
        return position.global_step >= 5


def test_the_loop_ends_where_its_policy_says(tmp_path, offline_cache, monkeypatch):
    monkeypatch.setattr(SingleEngine, "policy", lambda self, *args: StopAtFive())
    trainer, results = train(config(tmp_path, "--max_steps", "30"))
    assert results["global_step"] == 5 and trainer.loop.position.total_steps == 30
    assert results["history"][-1]["step"] == 5  # evaluated where it stopped


def test_entering_the_loop_drops_gradients_left_by_a_cut_short_step(tmp_path, offline_cache):
    """Elastic Horovod re-enters the loop after a worker was lost inside the all-reduce: the survivors'
    partial gradients must not be added to the next step's."""
    run_config = config(tmp_path, "--max_steps", "4")
    engine = SingleEngine(run_config)
    with engine.running():
        loop = Trainer(run_config, engine).setup()
        for p in loop.parts.model.parameters():
            p.grad = torch.ones_like(p)
        loop.enter(loop.position)
        assert all(p.grad is None or not p.grad.any() for p in loop.parts.model.parameters())


def test_the_run_says_in_one_line_what_its_labels_made_of_it(tmp_path, offline_cache, capsys):
    """Numbers written as JSON strings ("3.8") are a regression, and the run says so (rank 0, one line)."""
    rows = [{"text": f"example {i} moves the lamp", "label": f"{i % 9 / 2:.1f}"} for i in range(80)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    run_config = config(tmp_path, "--train_file", str(tmp_path / "train.jsonl"), "--max_steps", "1")
    engine = SingleEngine(run_config)
    with engine.running():
        Trainer(run_config, engine).setup()
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("task: ")] == ["task: regression (one number per example)"]
