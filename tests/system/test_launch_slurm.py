"""A real one-node SLURM cluster (Debian's slurm-wlm + munge, started here, config in a temporary directory):
the launch/slurm batch scripts are submitted with launch/slurm/submit.sh, 2 tasks each, and must train."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.jobs import BIN, REPO
from support.launch import LAUNCH_JOB, free_port, launch_env
from support.slurm import (
    STOP_JOB,
    SlurmCluster,
    assert_completed,
    assert_resumed_exactly,
    check_training,
    job_output,
    require_slurm,
    running,
    stop_and_resume,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    require_slurm()
    with running(SlurmCluster(tmp_path_factory.mktemp("slurm"))) as cluster:
        yield cluster


# ddp_torchrun's jobs here run a sharded engine (HVT_ENGINE): its default, ddp, trains in
# test_launch_slurm_two_nodes.py (ddp_torchrun without HVT_ENGINE).
TORCHRUN_ENGINE = "fsdp"


def job_env(cache_dir: Path, job: str) -> dict[str, str]:
    """A batch script's environment: its own rendezvous port (torchrun), ddp_torchrun's engine (TORCHRUN_ENGINE),
    and for horovod_mpirun a Horovod knob through HVT_MPIRUN_ARGS (fusion changes no sum: the parameters stay those
    of a run without it, horovod_srun's)."""
    knobs = {"HVT_MPIRUN_ARGS": "--fusion-threshold-mb 16"} if job == "horovod_mpirun" else {}
    knobs |= {"HVT_ENGINE": TORCHRUN_ENGINE} if job == "ddp_torchrun" else {}
    return launch_env(cache_dir, HVT_RDZV_PORT=str(free_port()), **knobs)


@dataclass(frozen=True)
class Finished:
    out: Path
    submitted: str  # what submit.sh printed
    output: str  # the job's output


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory, cache_dir) -> Callable[[str], Finished]:
    """A batch script's job of STOP_JOB run to the end, submitted once per module: horovod_srun's and
    ddp_torchrun's training tests read it, and the warning-signal tests compare their requeued runs with it
    (horovod_mpirun's with horovod_srun's: the same engine and job)."""
    done: dict[str, Finished] = {}

    def finished(job: str) -> Finished:
        if job not in done:
            workdir = tmp_path_factory.mktemp(job)
            out = workdir / "reference"
            env = job_env(cache_dir, job)
            job_id, submitted = slurm.submit(job, *STOP_JOB, "--output_dir", str(out), env=env, workdir=workdir)
            done[job] = Finished(out, submitted, assert_completed(slurm.wait(job_id, timeout=480)))
        return done[job]

    return finished


def test_srun_offers_pmix(slurm) -> None:
    """Debian's slurm-wlm ships the PMIx plugin, so Horovod's ranks start with plain srun --mpi=pmix."""
    proc = subprocess.run(["srun", "--mpi=list"], env=slurm.env(), capture_output=True, text=True, timeout=30)
    assert re.search(r"^\s*pmix\s*$", proc.stdout + proc.stderr, re.M), proc.stdout + proc.stderr


def test_horovod_srun_pmix_job_trains(uninterrupted) -> None:
    run = uninterrupted("horovod_srun")
    assert "+ sbatch " in run.submitted and "--ntasks-per-node=2" in run.submitted and "--gres" not in run.submitted
    assert f"+ srun --mpi=pmix --kill-on-bad-exit=1 {BIN}/python -m horovod_train train " in run.output
    assert check_training(run.out, "horovod")["controller"] == "mpi"


@dataclass(frozen=True)
class Resumed:
    out: Path
    output: str  # both runs' output
    stop: str  # the step it stopped at
    started: float  # when it was submitted (time.monotonic)


@pytest.fixture(scope="module")
def mpirun_resumed(slurm, tmp_path_factory, cache_dir) -> Resumed:
    """horovod_mpirun's STOP_JOB sent the warning signal at step 10, requeued and resumed to the end: its
    warning-signal test and its allocation-hosts test read it (no uninterrupted horovod_mpirun job)."""
    workdir = tmp_path_factory.mktemp("horovod_mpirun")
    out = workdir / "stopped"
    env = job_env(cache_dir, "horovod_mpirun")
    job_id = slurm.submit("horovod_mpirun", *STOP_JOB, "--output_dir", str(out), env=env, workdir=workdir)[0]
    started = time.monotonic()
    _, output, stop = stop_and_resume(slurm, job_id, out)
    return Resumed(out, output, stop, started)


def test_horovod_mpirun_job_uses_the_allocation_hosts(slurm, mpirun_resumed) -> None:
    run = mpirun_resumed
    assert f"-np 2 -H {slurm.host}:2 --fusion-threshold-mb 16 --" in run.output  # scontrol show hostnames -> -H
    assert "+ mpirun " in run.output and "-x HOROVOD_FUSION_THRESHOLD" in run.output
    assert check_training(run.out, "horovod")["controller"] == "mpi"


def test_ddp_torchrun_job_trains_a_sharded_engine_given_by_hvt_engine(uninterrupted) -> None:
    """fsdp (TORCHRUN_ENGINE): its checkpoint and output gathered on rank 0 like every engine's; an engine
    torchrun does not start is refused in one line (the next test)."""
    run = uninterrupted("ddp_torchrun")
    assert "--nnodes 1 --nproc_per_node 2 " in run.output
    assert "--rdzv_backend c10d --rdzv_endpoint 127.0.0.1:" in run.output
    assert check_training(run.out, TORCHRUN_ENGINE).get("launcher", "torchrun") == "torchrun"


def test_torchrun_job_refuses_an_engine_torchrun_does_not_start(slurm, tmp_path, cache_dir) -> None:
    job, _ = slurm.submit("ddp_torchrun", *LAUNCH_JOB, env=launch_env(cache_dir, HVT_ENGINE="horovod"),
                          workdir=tmp_path)  # fmt: skip
    fields = slurm.wait(job, timeout=120)
    output = job_output(fields)
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "2:0", f"{fields}\n{output}"
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "HVT_ENGINE=horovod is not an engine torchrun starts" in errors[0], output
    assert "zero1" in errors[0] and "fsdp" in errors[0] and "+ srun" not in output


@pytest.mark.parametrize(
    ("image", "needle"),
    [(None, "error: HVT_IMAGE is not set; fix: "), ("/no/such/image.sif", "error: image /no/such/image.sif does not")],
)
def test_apptainer_job_refuses_a_missing_image(slurm, tmp_path, cache_dir, image, needle) -> None:
    """No Apptainer here: what runs for real is the script's input validation inside a SLURM job."""
    env = launch_env(cache_dir)
    env.pop("HVT_IMAGE", None)
    if image:
        env["HVT_IMAGE"] = image
    job, _ = slurm.submit("horovod_apptainer", *LAUNCH_JOB, env=env, workdir=tmp_path)
    fields = slurm.wait(job, timeout=120)
    output = job_output(fields)
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "2:0", f"{fields}\n{output}"
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(needle), output
    assert "+ srun" not in output


def test_bad_input_under_srun_is_one_line_from_rank_0_and_nothing_is_touched(slurm, tmp_path, cache_dir) -> None:
    """The README's srun recipe with an --output_dir holding a user's file: every rank meets the same bad input,
    rank 0 says it in one line, the other rank ends with the job (srun --kill-on-bad-exit), exit 2, file intact."""
    out = tmp_path / "proj"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}')
    job, _ = slurm.submit("horovod_srun", *LAUNCH_JOB, "--output_dir", str(out), env=launch_env(cache_dir),
                          workdir=tmp_path)  # fmt: skip
    fields = slurm.wait(job, timeout=240)
    output = job_output(fields)
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "2:0", f"{fields}\n{output[-4000:]}"
    errors = [line for line in output.splitlines() if "error: " in line and "; fix: " in line]
    assert len(errors) == 1 and str(out) in errors[0], output[-4000:]
    assert "+ srun" in output, output[-4000:]
    assert (out / "config.json").read_text() == '{"mine": true}' and sorted(out.iterdir()) == [out / "config.json"]


def test_warning_signal_checkpoints_requeues_and_resumes(uninterrupted, mpirun_resumed) -> None:
    """What #SBATCH --signal=B:USR1@120 does before a time limit, sent now with scancel to a horovod_mpirun job:
    the batch shell passes SIGUSR1 to both ranks of the node, they checkpoint and stop, the job requeues itself,
    and the requeued run resumes from that checkpoint and ends with the parameters of an uninterrupted run of the
    same engine and job (horovod_srun's). horovod_srun's job is stopped and resumed in test_launch_slurm_two_nodes.py
    (the same script and forwarder, on each of two nodes); ddp_torchrun's in the test under MpiDefault=pmix below
    (its agent's case: one job, not one under each default)."""
    run = mpirun_resumed
    assert_resumed_exactly(uninterrupted("horovod_srun").out, run.out, "horovod", "horovod_mpirun", run.stop,
                           run.started)  # fmt: skip


def test_a_run_that_finishes_while_the_warning_signal_is_handled_is_not_requeued(slurm, tmp_path) -> None:
    """The warning signal can arrive during the final evaluation: the ranks finish (exit 0) and the job is
    done. It used to requeue itself whenever the signal had arrived."""
    marker = tmp_path / "launcher-started"
    launcher = tmp_path / "launcher.sh"
    # A launcher whose ranks are past their last step: it ends with 0 once the batch shell has the signal (its trap
    # says so in the job's output), whenever that is.
    launcher.write_text(
        f"touch {marker}\n"
        "for _ in $(seq 1200); do\n"
        f'    grep -q "batch shell got SIGUSR1" {tmp_path}/job-$SLURM_JOB_ID.out && exit 0\n'
        "    sleep 0.1\n"
        "done\n"
        "echo 'the batch shell got no SIGUSR1 within 120 s' >&2\n"
        "exit 1\n"
    )
    script = tmp_path / "finishes.sbatch"
    script.write_text(
        f"#!/usr/bin/env bash\nset -euo pipefail\nsource {REPO}/launch/slurm/common.sh\nhvt_slurm_run bash {launcher}\n"
    )
    proc = subprocess.run(
        ["sbatch", "--requeue", "--ntasks=1", f"--output={tmp_path}/job-%j.out", f"--chdir={tmp_path}", str(script)],
        env=slurm.env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    job_id = re.search(r"Submitted batch job (\d+)", proc.stdout)[1]
    slurm.jobs.append(job_id)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline, slurm.fields(job_id)
        time.sleep(0.5)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=slurm.env(), check=True, timeout=30)
    fields = slurm.wait(job_id, timeout=120)
    output = assert_completed(fields)
    assert fields["Restarts"] == "0", fields
    assert f"got SIGUSR1 but the run finished: not requeueing job {job_id}" in output, output


def test_torchrun_job_under_a_pmix_default_stops_without_killing_its_agent(
    uninterrupted, tmp_path_factory, tmp_path, cache_dir
) -> None:
    """MpiDefault=pmix: srun gives torchrun's agent PMIX_RANK too. The warning signal must reach its workers
    only (SIGUSR1 killed the agent while they checkpointed); the job checkpoints, requeues and resumes, and ends
    with the parameters of ddp_torchrun's uninterrupted run (TORCHRUN_ENGINE; on the module's cluster: the
    default leaves the training alone). Which processes the forwarder signals under each default:
    test_launch_slurm_signal.py."""
    require_slurm()
    reference = uninterrupted("ddp_torchrun").out
    with running(SlurmCluster(tmp_path_factory.mktemp("slurm-pmix"), mpi_default="pmix")) as cluster:
        out = tmp_path / "stopped"
        env = job_env(cache_dir, "ddp_torchrun")
        job_id = cluster.submit("ddp_torchrun", *STOP_JOB, "--output_dir", str(out), env=env, workdir=tmp_path)[0]
        started = time.monotonic()
        _, output, stop = stop_and_resume(cluster, job_id, out)
        signalled = re.findall(r"SIGUSR1 -> rank processes ([\d ]+) on", output)
        assert signalled and all(len(pids.split()) == 2 for pids in signalled), output[-4000:]  # the two workers
        assert_resumed_exactly(reference, out, TORCHRUN_ENGINE, "ddp_torchrun under MpiDefault=pmix", stop, started)
