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
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from support.jobs import REPO
from support.processes import wait_for
from support.slurm import JOB_ID_BLOCK, JOB_ID_BLOCKS

PROBE = Path(__file__).parents[1] / "probes" / "signal_probe.py"
WORKER = ["LOCAL_RANK=0", "RANK=0", "TORCHELASTIC_RUN_ID=hvt"]  # what torchrun adds for its workers
WORD = "--output_dir=/runs/torchrun"  # one more word of every probe's command line (no horovod_train in any)
# A rank before its run installed the checkpoint signals' handler: SIGUSR1 would kill it. It answers the barrier's
# SIGTERM (argv[1].done) to show it is still alive.
STARTING = (
    "import pathlib, signal, sys, time; "
    "signal.signal(signal.SIGTERM, lambda *_: pathlib.Path(sys.argv[1] + '.done').touch()); time.sleep(120)"
)


def test_the_warning_signal_reaches_ranks_and_never_a_launcher(tmp_path) -> None:
    # Job ids no test cluster of another run on this machine uses: the forwarder looks at every process here.
    block = JOB_ID_BLOCKS.take()
    try:
        signals_ranks_not_launchers(tmp_path, *(str((block + 1) * JOB_ID_BLOCK + n) for n in (0, 1)))
    finally:
        JOB_ID_BLOCKS.give_back(block)


def signals_ranks_not_launchers(tmp_path: Path, job: str, other_job: str) -> None:
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
        starting = subprocess.Popen([sys.executable, "-c", STARTING, str(tmp_path / "starting"), "horovod_train", WORD],
                                    env={**os.environ, "SLURM_JOB_ID": job, "PMIX_RANK": "4"})  # fmt: skip
        pids.append(starting.pid)
        ready = [tmp_path / f"{name}{'.child' if child else ''}.ready" for name, (_, _, child) in processes.items()]
        wait_for(lambda: all(path.exists() for path in ready), 60, "every probe to start")
        pids += [int((tmp_path / f"{name}.child.ready").read_text()) for name, (_, _, c) in processes.items() if c]

        proc = subprocess.run(["bash", "-c", f"source launch/slurm/common.sh && hvt_signal_local_ranks USR1 {job}"],
                              cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        # A barrier, not a pause: once every probe recorded the SIGTERM sent after the forwarder returned, each has
        # recorded its SIGUSR1 if it got one.
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        # The starting rank answers too, unless the SIGUSR1 that would be handled before the SIGTERM killed it.
        answered = lambda: len(list(tmp_path.glob("*.done"))) == len(pids) or starting.poll() is not None  # noqa: E731
        wait_for(answered, 60, "every probe's SIGTERM")
        signalled = sorted(path.name for path in tmp_path.iterdir() if path.suffix not in {".ready", ".done"}
                           and path.name != "torchrun")  # fmt: skip
        assert signalled == ["container-launcher.child", "mpirun-rank", "srun-pmix-rank", "torchrun-agent.child"], (
            signalled,
            proc.stdout,
        )
        survived = (tmp_path / "starting.done").exists()
        assert survived, f"a rank without a SIGUSR1 handler got it (exit {starting.poll()})"
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
