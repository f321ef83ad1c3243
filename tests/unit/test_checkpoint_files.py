"""Checkpoint directories as a crash and a requeue leave them: a replaced checkpoint is never lost, crash
leftovers are cleaned, rotation follows the run's lineage, `auto` starts fresh or resumes, and a resume
that would skip or repeat examples is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from horovod_train import checkpoint as ckpt
from horovod_train.position import TrainingPosition

COMPATIBILITY = ckpt.Compatibility("tiny", 3, 10, "Linear", 16)


def save(checkpoints: ckpt.Checkpoints, model: torch.nn.Module, step: int) -> Path:
    position = TrainingPosition(global_step=step, steps_in_epoch=step)
    return checkpoints.save(model, position, COMPATIBILITY, {}, {"optimizer": {}, "rng": []})


class BrokenModel(torch.nn.Linear):
    def state_dict(self, *args, **kwargs):
        raise OSError("disk full")


def test_replacing_a_checkpoint_keeps_the_old_one_until_the_new_one_is_complete(tmp_path):
    checkpoints = ckpt.Checkpoints(tmp_path, keep=1)
    first = save(checkpoints, torch.nn.Linear(2, 2), 5)
    with pytest.raises(OSError, match="disk full"):  # the same step saved again (epoch end), and the write fails
        save(checkpoints, BrokenModel(2, 2), 5)
    assert ckpt.verify_checkpoint(first)["global_step"] == 5
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-5"]  # no temporary left either
    replaced = save(checkpoints, torch.nn.Linear(2, 2), 5)
    assert ckpt.verify_checkpoint(replaced)["save_sequence"] == 2


def test_crash_leftovers_are_cleaned_and_a_set_aside_checkpoint_is_put_back(tmp_path):
    checkpoints = ckpt.Checkpoints(tmp_path, keep=5)
    for step in (5, 10):
        save(checkpoints, torch.nn.Linear(2, 2), step)
    (tmp_path / "checkpoint-10").rename(tmp_path / ".checkpoint-10.previous")  # a crash between the renames
    shutil.copytree(tmp_path / "checkpoint-5", tmp_path / ".checkpoint-5.previous")  # its successor is in place
    (tmp_path / ".checkpoint-15.k2j3.tmp").mkdir()  # a crash while writing
    ckpt.clean_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-5"]
    assert ckpt.load_resumable("latest", tmp_path, warn=print)[0].name == "checkpoint-10"
