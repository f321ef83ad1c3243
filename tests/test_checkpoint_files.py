"""Checkpoint directories as a crash and a requeue leave them: a replaced checkpoint is never lost, crash
leftovers are cleaned, rotation follows the run's lineage, `auto` starts fresh or resumes, and a resume
that would skip or repeat examples is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import SMALL_JOB, assert_ok, run, train_cmd

from horovod_train import checkpoint as ckpt
from horovod_train.output_dir import record
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


def train(tmp_path: Path, cache_dir: Path, out: Path, *args: str):
    job = [*SMALL_JOB, "--engine", "single", "--synthetic_num_examples", "600", "--output_dir", str(out), *args]
    return run(train_cmd(*job), cache_dir)


def test_rotation_follows_the_lineage_after_resuming_from_an_older_checkpoint(tmp_path, cache_dir):
    out = tmp_path / "run"
    assert_ok(train(tmp_path, cache_dir, out, "--max_steps", "40", "--save_steps", "10"))
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["checkpoint-34", "checkpoint-40"]  # epoch end, last
    # Back to step 34 (say, the run diverged after it), now keeping one checkpoint.
    args = ["--max_steps", "38", "--save_steps", "2", "--save_total_limit", "1"]
    assert_ok(train(tmp_path, cache_dir, out, *args, "--resume_from_checkpoint", str(out / "checkpoint-34")))
    # checkpoint-34 and -36 (this lineage) made way for checkpoint-38; checkpoint-40, of the abandoned
    # future, stays and is not mistaken for the newest.
    assert {p.name for p in ckpt.list_checkpoints(out)} == {"checkpoint-38", "checkpoint-40"}
    assert ckpt.load_resumable("auto", out, warn=print)[0].name == "checkpoint-38"
    state = json.loads((out / "checkpoint-38" / ckpt.TRAINER_FILE).read_text())
    assert state["lineage"][-1] == "checkpoint-38" and "checkpoint-40" not in state["lineage"]


def test_auto_starts_fresh_where_there_is_no_checkpoint(tmp_path, cache_dir):
    out = tmp_path / "new"
    proc = train(tmp_path, cache_dir, out, "--max_steps", "4", "--resume_from_checkpoint", "auto")
    assert_ok(proc)
    assert "no valid checkpoint" in proc.stdout and "starting fresh" in proc.stdout
    # An earlier attempt that died before its first checkpoint is started over.
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    record(attempt, "run_config.json", "metrics.jsonl")  # the ledger an attempt writes before anything else
    (attempt / "run_config.json").write_text("{}")
    (attempt / "metrics.jsonl").write_text('{"step": 1}\n')
    (attempt / ".checkpoint-2.x1y2.tmp").mkdir()
    assert_ok(train(tmp_path, cache_dir, attempt, "--max_steps", "4", "--resume_from_checkpoint", "auto"))
    assert not list(attempt.glob(".checkpoint-*")) and (attempt / "all_results.json").is_file()


def test_auto_does_not_replace_another_runs_files(tmp_path, cache_dir):
    out = tmp_path / "other"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = train(tmp_path, cache_dir, out, "--max_steps", "4", "--resume_from_checkpoint", "auto")
    assert proc.returncode == 2 and "holds files this project did not write (notes.txt)" in proc.stderr, proc.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_resume_with_another_global_batch_is_refused(tmp_path, cache_dir):
    """Steps of another global batch consume other examples: the position inside the epoch would skip or
    repeat some. Refused before anything is written."""
    out = tmp_path / "run"
    assert_ok(train(tmp_path, cache_dir, out, "--max_steps", "6", "--save_steps", "3"))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    proc = train(tmp_path, cache_dir, out, "--max_steps", "9", "--per_device_train_batch_size", "8",
                 "--resume_from_checkpoint", "latest")  # fmt: skip
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "global_batch=16 but this run has global_batch=8" in proc.stderr
    assert before == {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
