"""One job per output directory, and nothing lost in it: --overwrite_output_dir removes only what this project
wrote, a second job is refused while the first runs, a finished run is not rewritten, a requeued attempt
starts over, a moved run directory resumes, and --overwrite_cache rebuilds the shared cache once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.jobs import REPO, SMALL_JOB, assert_ok, base_env, horovodrun, train_cmd, train_here

from horovod_train.outputs import run_directory as outdir

DATA = [*SMALL_JOB, "--synthetic_num_examples", "600"]

JOB = [*DATA, "--engine", "single"]

UNTIL_KILLED = ["--max_steps", "100000", "--logging_steps", "1", "--save_strategy", "no"]


def train(cache_dir: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    """One run to the end, in this process; a job beside it (`start`) is a process of its own."""
    return train_here(cache_dir, *JOB, "--output_dir", str(out), *args)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def start(cache_dir: Path, out: Path, *args: str) -> subprocess.Popen:
    return background(train_cmd(*JOB, *UNTIL_KILLED, "--output_dir", str(out), *args), base_env(cache_dir))


def background(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip


def wait_for_steps(job: subprocess.Popen, out: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text().strip():
        assert job.poll() is None, f"the job ended early:\n{job.communicate()[0][-3000:]}"
        assert time.monotonic() < deadline, "the job logged no step in time"
        time.sleep(0.2)


def one_error_line(proc: subprocess.CompletedProcess, text: str) -> None:
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], proc.stderr


def test_overwrite_refuses_a_directory_holding_files_this_project_did_not_write(tmp_path, cache_dir):
    """`cd project && train --output_dir . --overwrite_output_dir` once deleted src/ and thesis.tex."""
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "model.py").write_text("print('mine')\n")
    (project / "thesis.tex").write_text("\\chapter{Mine}\n")
    before = snapshot(project)
    cmd = train_cmd(*JOB, "--max_steps", "2", "--output_dir", ".", "--overwrite_output_dir")
    proc = subprocess.run(cmd, cwd=project, env=base_env(cache_dir), capture_output=True, text=True, timeout=300)
    one_error_line(proc, "holds files this project did not write (src, thesis.tex)")
    assert snapshot(project) == before and sorted(p.name for p in project.iterdir()) == ["src", "thesis.tex"]


def test_overwrite_replaces_an_earlier_run_and_only_its_files(tmp_path, cache_dir):
    out = tmp_path / "run"
    assert_ok(train(cache_dir, out, "--max_steps", "6", "--save_steps", "3", "--report_to", "tensorboard",
                    "--do_predict", "--test_file", str(write_test_file(tmp_path))))  # fmt: skip
    first = set(os.listdir(out))
    assert {"checkpoint-3", "checkpoint-6", "runs", "tokenizer.json", "predict_results.txt"} <= first
    assert outdir.foreign_entries(out) == []  # everything it wrote is recorded as its own
    assert_ok(train(cache_dir, out, "--max_steps", "4", "--overwrite_output_dir"))
    second = set(os.listdir(out))
    assert not {"checkpoint-3", "checkpoint-6", "runs", "predict_results.txt"} & second
    assert json.loads((out / "all_results.json").read_text())["global_step"] == 4


def write_test_file(tmp_path: Path) -> Path:
    path = tmp_path / "test.csv"
    path.write_text("premise,hypothesis\nA dog runs.,An animal moves.\nA cat sleeps.,A cat is awake.\n")
    return path


def test_a_second_job_in_the_same_output_dir_is_refused_until_the_first_is_gone(tmp_path, cache_dir):
    out = tmp_path / "shared"
    first = start(cache_dir, out)
    try:
        wait_for_steps(first, out)
        holder = json.loads((out / outdir.RunFiles.LOCK).read_text())
        before = {name for name in os.listdir(out)}
        proc = train(cache_dir, out, "--max_steps", "4", "--overwrite_output_dir")
        one_error_line(proc, f"is in use by another job (pid {holder['pid']} on {holder['host']}")
        assert before <= set(os.listdir(out)) and (out / "run_config.json").is_file()
        assert json.loads((out / "run_config.json").read_text())["max_steps"] == 100000  # still the first job's
        os.killpg(first.pid, signal.SIGKILL)  # the holder dies without cleaning up: the kernel drops its lock
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert (out / outdir.RunFiles.LOCK).exists()
    assert_ok(train(cache_dir, out, "--max_steps", "4", "--overwrite_output_dir"))
    assert not (out / outdir.RunFiles.LOCK).exists()  # released, and the lock file removed, at the end


def test_auto_resume_of_a_finished_run_rewrites_nothing(tmp_path, cache_dir):
    out = tmp_path / "done"
    assert_ok(train(cache_dir, out, "--max_steps", "6", "--save_steps", "3"))
    before = snapshot(out)
    proc = train(cache_dir, out, "--max_steps", "6", "--save_steps", "3", "--resume_from_checkpoint", "auto")
    assert_ok(proc)
    assert "had already finished at step 6" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("validation accuracy ")  # from the saved results
    assert snapshot(out) == before


def test_a_requeued_attempt_killed_before_its_first_checkpoint_starts_over(tmp_path, cache_dir):
    """With --report_to tensorboard the attempt had also written runs/: still only its own files."""
    out = tmp_path / "requeued"
    attempt = start(cache_dir, out, "--report_to", "tensorboard")
    try:
        wait_for_steps(attempt, out)
    finally:
        os.killpg(attempt.pid, signal.SIGKILL)
        attempt.wait()
    assert (out / "runs").is_dir() and not list(out.glob("checkpoint-*"))
    proc = train(cache_dir, out, "--max_steps", "4", "--report_to", "tensorboard", "--resume_from_checkpoint", "auto")
    assert_ok(proc)
    assert "starting fresh" in proc.stdout


def test_a_moved_run_directory_resumes_and_loads_its_own_best_checkpoint(tmp_path, cache_dir):
    """best_model_checkpoint was stored as an absolute path: after `mv old new` the run ended in an error
    (or, had old/ still existed, silently loaded old/'s weights)."""
    old, new = tmp_path / "old", tmp_path / "new"
    args = ["--max_steps", "12", "--eval_strategy", "steps", "--eval_steps", "3", "--save_strategy", "steps",
            "--save_steps", "3", "--save_total_limit", "10", "--load_best_model_at_end",
            "--metric_for_best_model", "loss", "--greater_is_better", "true"]  # fmt: skip
    assert_ok(train(cache_dir, old, *args))
    state = json.loads((old / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["best_model_checkpoint"] == "checkpoint-6"  # a name: it moves with the directory
    old.rename(new)
    for name in ("checkpoint-9", "checkpoint-12", "all_results.json"):  # as a crash after step 6 left it
        path = new / name
        subprocess.run(["rm", "-rf", str(path)], check=True)
    proc = train(cache_dir, new, *args, "--resume_from_checkpoint", "auto")
    assert_ok(proc)
    results = json.loads((new / "trainer_state.json").read_text())
    best = Path(results["best_model_checkpoint"])
    assert best.parent == new and f"loaded the best model: {best}" in proc.stdout


@pytest.mark.slow
def test_overwrite_cache_rebuilds_the_shared_cache_once_before_any_rank_maps_it(tmp_path, cache_dir):
    """Each local rank rebuilt and replaced the tokenized cache in turn, deleting the files the ranks
    before it had memory-mapped. No rank may map a deleted cache file."""
    out = tmp_path / "cache-run"
    own_cache = tmp_path / "cache"
    cmd = horovodrun(2, *DATA, *UNTIL_KILLED, "--output_dir", str(out), "--overwrite_cache")
    job = background(cmd, {**base_env(cache_dir), "HOROVOD_TRAIN_CACHE": str(own_cache)})
    try:
        wait_for_steps(job, out, timeout=300)
        ranks = rank_pids(own_cache)
        assert len(ranks) == 2, ranks
        deleted = [line for pid in ranks for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
                   if str(own_cache / "tokenized") in line and "(deleted)" in line]  # fmt: skip
        assert deleted == [], f"ranks map deleted cache files: {deleted[:3]}"
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def rank_pids(cache: Path) -> list[int]:
    """The training ranks (a HOROVOD_RANK in their environment) that use ``cache``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if f"HOROVOD_TRAIN_CACHE={cache}".encode() in environ and any(e.startswith(b"HOROVOD_RANK=") for e in environ):
            found.append(int(entry.name))
    return found
