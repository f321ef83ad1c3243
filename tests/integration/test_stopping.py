"""A scheduler's stop signal (SIGTERM at a time limit, preemption or scancel; SIGUSR1 as the warning ahead of
it) under each launcher: the ranks agree at the next step boundary, rank 0 writes a checkpoint there, every
rank exits, and `--resume_from_checkpoint auto` completes the run (resumed here under plain python; RESUMED_HERE
names the tests that resume the others)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.checks import max_abs_diff
from support.jobs import (
    BIN,
    REPO,
    SMALL_JOB,
    assert_ok,
    base_env,
    probe_launch,
    read_results,
    run,
    train_cmd,
)
from support.processes import find_rank_process, wait_for

from horovod_train.engines.joining import implied_engine
from horovod_train.launching import launcher as launcher_row
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory
from horovod_train.training.stopping import STOPPED_EXIT_CODE

pytestmark = pytest.mark.slow

# The signal comes once 20 steps are logged and the ranks stop at the next step boundary: 100 steps to spare still
# leave the stop inside the run, and each resume trains the rest (at 400, the resumes trained 3/4 of this module).
MAX_STEPS = 120
JOB = [*SMALL_JOB, "--synthetic_num_examples", "3000", "--max_steps", str(MAX_STEPS), "--logging_steps", "5"]


def launch(launcher: str, *args: str) -> list[str]:
    """The job under a launcher of the table, with the engine it implies (--engine horovod is the default)."""
    return probe_launch(launcher, train_cmd("--engine", implied_engine(launcher_row(launcher)), *args))


def rank_variable(launcher: str) -> str:
    return launcher_row(launcher).variables.rank


def logged_step(out: Path) -> int:
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return json.loads(lines[-1])["step"] if lines else 0


def start(launcher: str, out: Path, cache_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        launch(launcher, *JOB, *extra, "--output_dir", str(out)),
        cwd=REPO,
        env=base_env(cache_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a job step is
    )


def signal_and_wait(job: subprocess.Popen, deliver, out: Path) -> tuple[str, int, float, int]:
    """Deliver the signal once training runs; (output, step logged before it, seconds to the exit, exit code)."""
    try:
        wait_for(lambda: logged_step(out) >= 20, 240, "20 steps")
        before = logged_step(out)
        sent = time.monotonic()
        deliver()
        output, _ = job.communicate(timeout=120)
        return output, before, time.monotonic() - sent, job.returncode
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


# (launcher, signal, whom the scheduler or user signals, the exit code the launcher reports)
CASES = [
    ("horovodrun", signal.SIGTERM, "group", 1),  # SLURM signals every process of the step
    ("torchrun", signal.SIGTERM, "launcher", 1),  # torchrun passes SIGTERM on to its workers
    ("mpirun", signal.SIGTERM, "ranks", STOPPED_EXIT_CODE),  # mpirun would kill the ranks 1 s after its own
    ("mpirun", signal.SIGUSR1, "launcher", STOPPED_EXIT_CODE),  # mpirun forwards SIGUSR1 to the ranks
    ("plain", signal.SIGTERM, "launcher", STOPPED_EXIT_CODE),
]
# The launchers whose stopped run is resumed here. A stop's checkpoint is verified under every launcher above; its
# resume does not depend on how the signal came, and under the others it is checked more strictly elsewhere:
# tests/system/test_launch_slurm.py::test_warning_signal_checkpoints_requeues_and_resumes (horovod_mpirun; ddp_torchrun
# under MpiDefault=pmix, fsdp: a signal-stopped job resumes to an uninterrupted run's parameters),
# tests/integration/test_k8s_manifests.py::test_pod_sigterm_checkpoints_and_the_restarted_pod_resumes[torchrun],
# and under horovodrun test_sigkill_while_stopping_leaves_valid_checkpoints_and_auto_resumes_from_the_newest below
# (to an uninterrupted run's parameters) and tests/integration/test_elastic.py::
# test_stopped_elastic_job_resumes_on_another_world_size (SIGTERM to horovodrun's group, the stop checkpoint resumed).
RESUMED_HERE = {"plain"}


@pytest.mark.parametrize(("launcher", "sig", "target", "exit_code"), CASES, ids=lambda c: getattr(c, "name", c))
def test_stop_signal_checkpoints_at_the_next_step_and_auto_resume_completes(
    tmp_path, cache_dir, launcher, sig, target, exit_code
):
    out = tmp_path / "run"
    job = start(launcher, out, cache_dir)

    def deliver() -> None:
        if target == "group":
            os.killpg(job.pid, sig)
        elif target == "launcher":
            os.kill(job.pid, sig)
        else:
            for rank in (0, 1):
                os.kill(wait_for(lambda r=rank: find_rank_process(out, rank_variable(launcher), r), 30, "a rank"), sig)

    output, before, seconds, code = signal_and_wait(job, deliver, out)
    assert code == exit_code, output[-3000:]
    saved = RunDirectory(out).checkpoints()
    assert saved, output[-3000:]
    step = ckpt.verify_checkpoint(saved[-1])["global_step"]
    assert before <= step < MAX_STEPS, (before, step)
    if launcher != "mpirun" or sig == signal.SIGUSR1:  # mpirun stops relaying output once it is signalled
        assert f"stopped by {sig.name} at step {step}: saved checkpoint-{step}" in output, output[-3000:]
    assert not re.search(r'File ".*/horovod_train/', output), "a rank printed a traceback"  # launchers may
    assert not list(out.glob(".checkpoint-*")), "a temporary checkpoint was left behind"
    print(
        f"{launcher} {sig.name} to {target}: checkpoint-{step} (logged step {before} when signalled), "
        f"exit {code} {seconds:.1f}s after the signal"
    )

    if launcher not in RESUMED_HERE:
        return
    resumed = run(launch(launcher, *JOB, "--output_dir", str(out), "--resume_from_checkpoint", "auto"), cache_dir)
    assert_ok(resumed)
    assert f"resumed from step {step}" in resumed.stdout
    results = read_results(out)
    assert results["global_step"] == MAX_STEPS and len(set(results["param_checksum_per_rank"])) == 1


def started_a_checkpoint_after(out: Path, step: int) -> bool:
    """Rank 0 began writing a checkpoint of a step after ``step``: its temporary directory (or, written already,
    the checkpoint itself) is there."""
    names = [p.name for p in out.iterdir()] if out.is_dir() else []
    steps = [int(m[1]) for m in (re.fullmatch(r"\.?checkpoint-(\d+)(\..*\.tmp)?", n) for n in names) if m]
    return any(s > step for s in steps)


def test_sigkill_while_stopping_leaves_valid_checkpoints_and_auto_resumes_from_the_newest(tmp_path, cache_dir):
    """A second SIGTERM (a scheduler's repeat) while the stop checkpoint is being written, SIGKILL right after it:
    only complete checkpoints are left (the one being written is a temporary directory until it is whole), and
    `auto` resumes from the newest of them (periodic ones, --save_steps, when the stop checkpoint was cut off) and
    ends with the parameters of an uninterrupted run."""
    periodic = ["--save_steps", "10"]
    reference, out = tmp_path / "reference", tmp_path / "run"
    assert_ok(run(launch("horovodrun", *JOB, *periodic, "--output_dir", str(reference)), cache_dir))
    job = start("horovodrun", out, cache_dir, *periodic)

    def deliver() -> None:
        # SIGKILL to every process of the job, as SLURM's to a step: horovodrun starts each rank in a process group
        # of its own, which a SIGKILL to horovodrun's group does not reach (the ranks then finished the checkpoint).
        ranks = [
            wait_for(lambda r=r: find_rank_process(out, rank_variable("horovodrun"), r), 30, "a rank") for r in (0, 1)
        ]
        groups = [*(os.getpgid(pid) for pid in ranks), job.pid]
        signalled_at = logged_step(out)
        os.killpg(job.pid, signal.SIGTERM)
        # Polled every millisecond: writing tiny-bert's checkpoint takes tens.
        what = f"a checkpoint after step {signalled_at} (the stop checkpoint)"
        wait_for(lambda: started_a_checkpoint_after(out, signalled_at) or job.poll() is not None, 60, what, 0.001)
        os.killpg(job.pid, signal.SIGTERM)
        for group in groups:
            os.killpg(group, signal.SIGKILL)

    output, before, _, code = signal_and_wait(job, deliver, out)
    assert code == -signal.SIGKILL, f"the job ended with {code} before SIGKILL reached it:\n{output[-3000:]}"
    saved = RunDirectory(out).checkpoints()
    for path in saved:
        ckpt.verify_checkpoint(path)
    newest = ckpt.verify_checkpoint(saved[-1])["global_step"] if saved else 0
    assert newest >= 10, f"no periodic checkpoint before the signal at step {before}: {[p.name for p in saved]}"
    cut_off = sorted(p.name for p in out.glob(".checkpoint-*"))
    print(f"SIGKILL at logged step {before}: newest complete checkpoint-{newest}, cut off: {cut_off or 'none'}")

    resumed = run(launch("horovodrun", *JOB, *periodic, "--output_dir", str(out), "--resume_from_checkpoint", "auto"),
                  cache_dir)  # fmt: skip
    assert_ok(resumed)
    assert f"resumed from step {newest}" in resumed.stdout, resumed.stdout[-3000:]
    assert not list(out.glob(".checkpoint-*")), "what the killed write left was not cleaned up"
    results = read_results(out)
    assert results["global_step"] == MAX_STEPS and len(set(results["param_checksum_per_rank"])) == 1, results
    assert max_abs_diff(reference, out) <= 1e-6


def test_no_checkpoint_signals_means_the_default_action(tmp_path, cache_dir):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        train_cmd("--engine", "single", *JOB, "--checkpoint_signals", "none", "--output_dir", str(out)),
        cwd=REPO, env=base_env(cache_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    _, _, _, code = signal_and_wait(proc, lambda: proc.send_signal(signal.SIGTERM), out)
    assert code == -signal.SIGTERM and not RunDirectory(out).checkpoints()


def after_close(received: bool) -> subprocess.CompletedProcess:
    """A process that watched SIGUSR1, stopped (or not), closed its watch, and then gets SIGUSR1."""
    code = (
        "import os, signal, sys\n"
        "from horovod_train.training.stopping import StopSignals\n"
        "watch = StopSignals([signal.SIGUSR1])\n"
        f"if {received}: os.kill(os.getpid(), signal.SIGUSR1)\n"
        "watch.close()\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "print('survived', flush=True)\n"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("received", [True, False])
def test_a_late_stop_signal_after_stopping_is_ignored(received):
    """The batch shell signals each rank; one that already stopped with the others must not die of a late
    SIGUSR1 (its launcher would report the job failed). Without a stop, close() gives the default back."""
    proc = after_close(received)
    if received:
        assert proc.returncode == 0 and "survived" in proc.stdout, proc.stderr
    else:
        assert proc.returncode == -signal.SIGUSR1, (proc.returncode, proc.stdout, proc.stderr)


AGREEMENT_PROBE = [str(BIN / "python"), str(REPO / "tests" / "probes" / "stop_agreement_probe.py")]


@pytest.mark.parametrize("engine", ["horovod", "ddp"])
def test_a_rank_stopped_by_another_ranks_signal_survives_its_own_late_one(engine, tmp_path, cache_dir):
    """Two real ranks: rank 1 alone gets SIGUSR1, both agree on it through the engine's all-reduce and close
    their watch; then each gets SIGUSR1 (on SLURM, the batch shell's forward reaches one node after the other).
    Rank 0 never received its own before stopping, and must still survive it (it died of it, exit 138, its
    "stopped by" line unflushed, in tests/system/test_launch_slurm_two_nodes.py)."""
    launcher = {"horovod": "horovodrun", "ddp": "torchrun"}[engine]
    assert_ok(run(probe_launch(launcher, [*AGREEMENT_PROBE, engine, str(tmp_path)]), cache_dir, timeout=240))
    reports = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
    assert [r["received"] for r in reports] == [None, "SIGUSR1"], reports
    assert [r["agreed"] for r in reports] == ["SIGUSR1", "SIGUSR1"], reports
