"""Checkpoint directories as a crash and a requeue leave them: a replaced checkpoint is never lost, crash
leftovers are cleaned, rotation follows the run's lineage, `auto` starts fresh or resumes, and a resume
that would skip or repeat examples is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.filesystems import fill, small_filesystem
from support.jobs import SMALL_JOB, assert_ok, mpirun, run, train_here

from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory, record


def train(tmp_path: Path, cache_dir: Path, out: Path, *args: str):
    """One process, in this one."""
    job = [*SMALL_JOB, "--engine", "single", "--synthetic_num_examples", "600", "--output_dir", str(out), *args]
    return train_here(cache_dir, *job)


def test_rotation_follows_the_lineage_after_resuming_from_an_older_checkpoint(tmp_path, cache_dir):
    out = tmp_path / "run"
    assert_ok(train(tmp_path, cache_dir, out, "--max_steps", "40", "--save_steps", "10"))
    assert [p.name for p in RunDirectory(out).checkpoints()] == ["checkpoint-34", "checkpoint-40"]  # epoch end, last
    # Back to step 34 (say, the run diverged after it), now keeping one checkpoint.
    args = ["--max_steps", "38", "--save_steps", "2", "--save_total_limit", "1"]
    assert_ok(train(tmp_path, cache_dir, out, *args, "--resume_from_checkpoint", str(out / "checkpoint-34")))
    # checkpoint-34 and -36 (this lineage) made way for checkpoint-38; checkpoint-40, of the abandoned
    # future, stays and is not mistaken for the newest.
    assert {p.name for p in RunDirectory(out).checkpoints()} == {"checkpoint-38", "checkpoint-40"}
    assert ckpt.load_resumable("auto", RunDirectory(out), warn=print)[0].name == "checkpoint-38"
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


@pytest.mark.parametrize("engine", ["ddp", "fsdp", "fsdp --save_async"])
def test_a_full_disk_during_a_checkpoint_stops_every_rank_with_one_line(engine, tmp_path, cache_dir):
    """A run on a small tmpfs: checkpoint-3 fits, then the disk is filled and the resumed run (2 ranks under
    mpirun) cannot write checkpoint-6. Every rank exits 2 with the one line (rank 0 said ``RuntimeError: [enforce
    fail at inline_container.cc:672]``, rank 1 failed in the next collective; fsdp's ranks, which all write, raised
    DCP's CheckpointException, a BaseException, and left the temporary directory), checkpoint-3 still verifies, no
    temporary is left, and once space is freed the run resumes from it. Saved beside training (--save_async), the
    ranks' background writes fail and every rank reports it, in the same line, when the run waits for the save."""
    job = [*SMALL_JOB, "--synthetic_num_examples", "600", "--save_steps", "3"]
    with small_filesystem(tmp_path / "disk", 64 << 20) as disk:
        out = disk / "run"
        assert_ok(train_here(cache_dir, "--engine", "single", *job, "--max_steps", "3", "--output_dir", str(out)))
        checkpoint = out / "checkpoint-3"
        fill(disk, leave_bytes=sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file()) // 2)
        resume = ["--max_steps", "6", "--output_dir", str(out), "--resume_from_checkpoint", "latest"]
        # The same global batch of 16 on 2 ranks.
        proc = run(mpirun(2, *job, "--engine", *engine.split(), "--per_device_train_batch_size", "8", *resume),
                   cache_dir, timeout=300)  # fmt: skip
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert proc.returncode == 2 and errors, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
        assert set(errors) == {errors[0]} and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert errors[0].startswith(f"error: no space left on device in {out} (the filesystem mounted at {disk}): ")
        assert "checkpoint-6 was not written" in errors[0] and "--output_dir elsewhere" in errors[0]
        assert ckpt.verify_checkpoint(checkpoint)["global_step"] == 3
        assert sorted(p.name for p in out.glob("*checkpoint-*")) == ["checkpoint-3"]
        (disk / "ballast").unlink()
        resumed = train_here(cache_dir, "--engine", "single", *job, *resume)
        assert_ok(resumed)
        assert "resumed from step 3" in resumed.stdout
