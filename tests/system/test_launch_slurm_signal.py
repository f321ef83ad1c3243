"""Which processes launch/slurm/common.sh's warning-signal forwarder signals, on real processes whose command
lines and environments are those of ranks and launchers (tests/probes/signal_probe.py stands in for each). Under
MpiDefault=pmix or pmi2 srun gives every task PMIX_RANK/PMI_RANK, launchers included: torchrun's agent, which
SIGUSR1 kills while its workers checkpoint, must not get it, nor a rank still starting (no handler yet: SIGUSR1
would kill it). The command line does not decide: the console script's ranks hold no `horovod_train`, and a word
such as a worker's `--output_dir=/runs/torchrun` does not make a rank torchrun's agent.
tests/system/test_launch_slurm.py runs the real jobs."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from support.jobs import REPO

PROBE = Path(__file__).parents[1] / "probes" / "signal_probe.py"
WORKER = ["LOCAL_RANK=0", "RANK=0", "TORCHELASTIC_RUN_ID=hvt"]  # what torchrun adds for its workers
WORD = "--output_dir=/runs/torchrun"  # one more word of every probe's command line (no horovod_train in any)
STARTING = "import time; time.sleep(120)"  # a rank before its run installed the checkpoint signals' handler


def test_the_warning_signal_reaches_ranks_and_never_a_launcher(tmp_path) -> None:
    job, other_job = str(random.randint(10**6, 10**7)), str(random.randint(10**7, 10**8))
    torchrun = tmp_path / "torchrun"  # a launcher script named as torchrun's console script is
    shutil.copy(PROBE, torchrun)
    processes = {  # name -> (script, environment, the child's extra environment)
        "srun-pmix-rank": (PROBE, {"SLURM_JOB_ID": job, "PMIX_RANK": "0"}, []),
        "torchrun-agent": (torchrun, {"SLURM_JOB_ID": job, "PMIX_RANK": "1"}, WORKER),
        "torchrun-agent-starting": (torchrun, {"SLURM_JOB_ID": job, "PMI_RANK": "2"}, []),
        "container-launcher": (PROBE, {"SLURM_JOB_ID": job, "PMIX_RANK": "3"}, ["HVT_IN_CONTAINER=1"]),
        "mpirun-rank": (PROBE, {"SLURM_JOB_ID": job, "OMPI_COMM_WORLD_RANK": "0"}, []),
        "other-job-rank": (PROBE, {"SLURM_JOB_ID": other_job, "PMIX_RANK": "0"}, []),
        "launcher-without-rank": (PROBE, {"SLURM_JOB_ID": job}, []),
    }
    pids = []
    try:
        for name, (script, env, child) in processes.items():
            full_env = {**os.environ, **env, "HVT_PROBE": str(PROBE)}
            marker = str(tmp_path / name)
            argv = [sys.executable, str(script), marker, WORD, *child]
            pids.append(subprocess.Popen(argv, env=full_env).pid)
        starting = subprocess.Popen([sys.executable, "-c", STARTING, "horovod_train", WORD],
                                    env={**os.environ, "SLURM_JOB_ID": job, "PMIX_RANK": "4"})  # fmt: skip
        pids.append(starting.pid)
        ready = [tmp_path / f"{name}{'.child' if child else ''}.ready" for name, (_, _, child) in processes.items()]
        deadline = time.monotonic() + 60
        while not all(path.exists() for path in ready) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(path.exists() for path in ready)
        pids += [int((tmp_path / f"{name}.child.ready").read_text()) for name, (_, _, c) in processes.items() if c]

        proc = subprocess.run(["bash", "-c", f"source launch/slurm/common.sh && hvt_signal_local_ranks USR1 {job}"],
                              cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        time.sleep(1)
        signalled = sorted(path.name for path in tmp_path.iterdir() if not path.name.endswith(".ready")
                           and path.name != "torchrun")  # fmt: skip
        assert signalled == ["container-launcher.child", "mpirun-rank", "srun-pmix-rank", "torchrun-agent.child"], (
            signalled,
            proc.stdout,
        )
        assert starting.poll() is None, f"a rank without a SIGUSR1 handler got it (exit {starting.returncode})"
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
