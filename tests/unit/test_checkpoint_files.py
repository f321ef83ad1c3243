"""Checkpoint directories as a crash and a requeue leave them: a replaced checkpoint is never lost, crash
leftovers are cleaned, rotation follows the run's lineage, `auto` starts fresh or resumes, and a resume
that would skip or repeat examples is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from support.filesystems import small_filesystem

from horovod_train.common.errors import UsageError
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory, clean_stale
from horovod_train.training.position import TrainingPosition

COMPATIBILITY = ckpt.Compatibility("tiny", 3, 10, "Linear", 16)


def save(checkpoints: ckpt.Checkpoints, model: torch.nn.Module, step: int) -> Path:
    position = TrainingPosition(global_step=step, steps_in_epoch=step)
    return checkpoints.save(model, position, COMPATIBILITY, {}, {"optimizer": {}, "rng": []})


class BrokenModel(torch.nn.Linear):
    def state_dict(self, *args, **kwargs):
        raise OSError("disk full")


def test_replacing_a_checkpoint_keeps_the_old_one_until_the_new_one_is_complete(tmp_path):
    checkpoints = ckpt.Checkpoints(RunDirectory(tmp_path), keep=1)
    first = save(checkpoints, torch.nn.Linear(2, 2), 5)
    with pytest.raises(OSError, match="disk full"):  # the same step saved again (epoch end), and the write fails
        save(checkpoints, BrokenModel(2, 2), 5)
    assert ckpt.verify_checkpoint(first)["global_step"] == 5
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-5"]  # no temporary left either
    replaced = save(checkpoints, torch.nn.Linear(2, 2), 5)
    assert ckpt.verify_checkpoint(replaced)["save_sequence"] == 2


def test_crash_leftovers_are_cleaned_and_a_set_aside_checkpoint_is_put_back(tmp_path):
    checkpoints = ckpt.Checkpoints(RunDirectory(tmp_path), keep=5)
    for step in (5, 10):
        save(checkpoints, torch.nn.Linear(2, 2), step)
    (tmp_path / "checkpoint-10").rename(tmp_path / ".checkpoint-10.previous")  # a crash between the renames
    shutil.copytree(tmp_path / "checkpoint-5", tmp_path / ".checkpoint-5.previous")  # its successor is in place
    (tmp_path / ".checkpoint-15.k2j3.tmp").mkdir()  # a crash while writing
    clean_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-5"]
    assert ckpt.load_resumable("latest", RunDirectory(tmp_path), warn=print)[0].name == "checkpoint-10"


MIB = 1 << 20


@pytest.mark.parametrize("writer", ["SafetensorError", "RuntimeError", "OSError"])
def test_a_full_disk_is_a_one_line_error_and_the_earlier_checkpoint_stays_valid(tmp_path, writer):
    """A real ENOSPC (a 1 MiB tmpfs) in each kind of writer: safetensors (the model), torch.save (the training
    state: it used to say ``RuntimeError: [enforce fail at inline_container.cc:672]``) and a plain write (the
    trainer state). One line naming the filesystem and the fix; the temporary directory is removed."""
    with small_filesystem(tmp_path / "disk", MIB) as disk:
        checkpoints = ckpt.Checkpoints(RunDirectory(disk), keep=1)
        first = save(checkpoints, torch.nn.Linear(2, 2), 5)
        model, state, config = torch.nn.Linear(2, 2), {"optimizer": {}, "rng": []}, {}
        if writer == "SafetensorError":
            model = torch.nn.Linear(1024, 512)  # 2 MiB of weights
        elif writer == "RuntimeError":
            state["ballast"] = torch.zeros(2 * MIB // 4)
        else:
            config = {"ballast": "x" * 2 * MIB}
        position = TrainingPosition(global_step=10, steps_in_epoch=10)
        with pytest.raises(UsageError) as refused:
            checkpoints.save(model, position, COMPATIBILITY, config, state)
        assert type(refused.value.__cause__).__name__ == writer  # the writer this case fills the disk with
        line = str(refused.value)
        assert "\n" not in line
        assert line.startswith(f"no space left on device in {disk} (the filesystem mounted at {disk}): "), line
        assert "checkpoint-10 was not written" in line and "--output_dir elsewhere" in refused.value.fix
        assert [p.name for p in disk.iterdir()] == ["checkpoint-5"]  # no temporary left
        assert ckpt.verify_checkpoint(first)["global_step"] == 5
        assert ckpt.load_resumable("latest", RunDirectory(disk), warn=print)[0] == first
