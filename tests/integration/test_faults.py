"""Fault injection: kill -9 one rank of a 2-rank run mid-epoch. The job must exit non-zero quickly
(no hang), the last checkpoint must be intact, and resuming must complete the run."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from support.jobs import REPO, SMALL_JOB, assert_ok, base_env, horovodrun, read_results, run, torchrun
from support.processes import find_rank_process, wait_for

from horovod_train import checkpoint as ckpt
from horovod_train.launching import LAUNCHERS

pytestmark = pytest.mark.slow

# Rank 1 is killed once checkpoint-40 is there (a step or two later): 80 steps to spare leave the kill inside the run,
# and the resume trains the rest (at 300, the resume was most of the test).
MAX_STEPS = 120
JOB = [
    *SMALL_JOB,
    "--synthetic_num_examples",
    "4000",
    "--max_steps",
    str(MAX_STEPS),
    "--save_steps",
    "20",
    "--logging_steps",
    "20",
]
# The README's "within seconds" (measured 0.3 s under horovodrun, 2 s under torchrun), with room for a loaded 2-core
# machine; below Gloo's 30-s timeout (HOROVOD_GLOO_TIMEOUT_SECONDS): a job ended only by a timeout fails.
DETECTED_WITHIN = 20
RANK_VARIABLE = {"horovod": LAUNCHERS["horovodrun"].variables.rank, "ddp": LAUNCHERS["torchrun"].variables.rank}


@pytest.mark.parametrize("engine", ["horovod", "ddp"])
def test_killed_rank_stops_the_job_and_resume_completes_it(engine, tmp_path, cache_dir):
    out = tmp_path / "run"
    args = [*JOB, "--engine", engine, "--output_dir", str(out)]
    cmd = horovodrun(2, *args) if engine == "horovod" else torchrun(2, *args)
    job = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=base_env(cache_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(lambda: (out / "checkpoint-40").is_dir(), 240, "checkpoint-40")
        victim = wait_for(lambda: find_rank_process(out, RANK_VARIABLE[engine], 1), 30, "rank 1's process")
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        try:
            job.wait(timeout=DETECTED_WITHIN)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"{engine}: the job still runs {DETECTED_WITHIN} s after rank 1 was killed (a hang or a timeout)"
            )
        detected = time.monotonic() - killed_at
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    output = job.stdout.read()
    print(f"{engine}: exit {job.returncode} {detected:.1f}s after kill -9 of rank 1")
    assert job.returncode != 0, output[-3000:]

    saved = ckpt.list_checkpoints(out)
    assert saved, "the checkpoints written before the kill must remain"
    for path in saved:
        ckpt.verify_checkpoint(path)  # raises if truncated or corrupted
    last_step = int(saved[-1].name.split("-")[1])
    assert 40 <= last_step < MAX_STEPS

    cmd = (
        horovodrun(2, *args, "--resume_from_checkpoint", "latest")
        if engine == "horovod"
        else torchrun(2, *args, "--resume_from_checkpoint", "latest")
    )
    proc = run(cmd, cache_dir, timeout=300)
    assert_ok(proc)
    assert f"resumed from step {last_step}" in proc.stdout
    results = read_results(out)
    assert results["global_step"] == MAX_STEPS
    assert results["param_checksum_per_rank"][0] == results["param_checksum_per_rank"][1]
