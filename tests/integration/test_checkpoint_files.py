"""Checkpoint directories as a crash and a requeue leave them: a replaced checkpoint is never lost, crash
leftovers are cleaned, rotation follows the run's lineage, `auto` starts fresh or resumes, and a resume
that would skip or repeat examples is refused."""

from __future__ import annotations

import json
from pathlib import Path

from support.jobs import SMALL_JOB, assert_ok, run, train_cmd

from horovod_train import checkpoint as ckpt
from horovod_train.run_directory import record


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
