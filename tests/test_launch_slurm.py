"""A real one-node SLURM cluster (Debian's slurm-wlm + munge, started here, config in a temporary directory):
the launch/slurm batch scripts are submitted with launch/slurm/submit.sh, 2 tasks each, and must train."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BIN, read_results
from launch_support import LAUNCH, LAUNCH_JOB, ensure_commands, free_port, launch_env

pytestmark = pytest.mark.slow

DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
SLURM_CONF = """\
ClusterName=hvt-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/munge.socket
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
# No cgroups in a container: track processes through /proc, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# 2 CPUs whatever the machine has (the jobs are tiny); slurm.conf wins over the hardware.
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """munged + slurmctld + slurmd as children of the test process; everything under one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.daemons: list[subprocess.Popen] = []
        self.jobs: list[str] = []

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def _daemon(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / f"{name}.out", "w")  # noqa: SIM115 (kept open for the daemon's lifetime)
        self.daemons.append(
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True)
        )

    def start(self) -> None:
        for sub in ("munge", "state", "spool"):
            (self.root / sub).mkdir(mode=0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.conf.write_text(
            SLURM_CONF.format(host=self.host, dir=self.root, ctld_port=free_port(), slurmd_port=free_port())
        )
        munge = self.root / "munge"
        self._daemon(
            "munged",
            ["munged", "--foreground", "--force", f"--socket={munge}/munge.socket", f"--key-file={key}"]
            + [f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log", f"--seed-file={munge}/seed"],
        )
        self._wait(lambda: (munge / "munge.socket").exists(), 30, "munged did not create its socket")
        self._daemon("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._daemon("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.host])
        self._wait(lambda: "State=IDLE " in self.scontrol("show", "node", self.host), 90, "the node is not idle")

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            for daemon in self.daemons:
                assert daemon.poll() is None, f"{daemon.args[0]} exited {daemon.returncode}:\n{self.logs()}"
            time.sleep(0.5)
        raise AssertionError(f"{what} within {timeout}s:\n{self.logs()}")

    def scontrol(self, *args: str) -> str:
        proc = subprocess.run(["scontrol", *args], env=self.env(), capture_output=True, text=True, timeout=30)
        return proc.stdout

    def logs(self) -> str:
        parts = []
        for name in ("munged.out", "slurmctld.log", "slurmd.log"):
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name}\n" + "\n".join(path.read_text().splitlines()[-25:]))
        return "\n".join(parts)

    def submit(self, job: str, *args: str, env: dict[str, str], workdir: Path) -> tuple[str, str]:
        """launch/slurm/submit.sh JOB with 2 tasks; returns (job id, submit.sh's stdout)."""
        out = workdir / f"{job}-%j.out"
        cmd = [str(LAUNCH / "slurm" / "submit.sh"), job, "--ntasks-per-node", "2", "--cpus-per-task", "1"]
        cmd += ["--output", str(out), "--time", "00:15:00", "--sbatch", f"--chdir={workdir}", "--", *args]
        proc = subprocess.run(
            cmd, cwd=workdir, env={**env, "SLURM_CONF": str(self.conf)}, capture_output=True, text=True, timeout=60
        )
        match = re.search(r"Submitted batch job (\d+)", proc.stdout)
        assert proc.returncode == 0 and match, proc.stdout + proc.stderr
        self.jobs.append(match[1])
        return match[1], proc.stdout

    def wait(self, job_id: str, timeout: float) -> dict[str, str]:
        """The job's final `scontrol show job` fields (no slurmdbd here, so no sacct)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = dict(re.findall(r"(\w+)=(\S*)", self.scontrol("show", "job", "-o", job_id)))
            if fields.get("JobState") in DONE:
                return fields
            time.sleep(2)
        subprocess.run(["scancel", job_id], env=self.env(), timeout=30)
        raise AssertionError(f"job {job_id} not finished within {timeout}s:\n{self.logs()}")

    def release_requeued(self, job_id: str, timeout: float) -> None:
        """Slurm holds a requeued job for about two minutes (Reason=BeginTime): once it is pending
        again, let it start now."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = dict(re.findall(r"(\w+)=(\S*)", self.scontrol("show", "job", "-o", job_id)))
            # ... and once the first attempt's step daemons are gone (a new step 0 of the same job collides).
            steps = subprocess.run(["pgrep", "-f", f"slurmstepd: \\[{job_id}\\."], capture_output=True).stdout
            if fields.get("JobState") == "PENDING" and fields.get("Restarts") == "1" and not steps:
                self.scontrol("update", f"JobId={job_id}", "StartTime=now")
                return
            assert fields.get("JobState") not in DONE, fields
            time.sleep(1)
        raise AssertionError(f"job {job_id} was not requeued within {timeout}s:\n{self.logs()}")

    def stop(self) -> None:
        if self.jobs:
            subprocess.run(["scancel", *self.jobs], env=self.env(), capture_output=True, timeout=30)
        for daemon in reversed(self.daemons):
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGTERM)
                try:
                    daemon.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(daemon.pid, signal.SIGKILL)
                    daemon.wait(timeout=10)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    ensure_commands({"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client", "munged": "munge"})
    if os.geteuid() != 0:
        pytest.skip("the test cluster's slurmd runs jobs as any user only when started as root")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def job_output(fields: dict[str, str]) -> str:
    return Path(fields["StdOut"]).read_text()


def assert_completed(fields: dict[str, str]) -> str:
    output = job_output(fields)
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", f"{fields}\n{output[-4000:]}"
    return output


def check_training(out: Path, engine: str) -> dict:
    results = read_results(out)
    assert results["world_size"] == 2 and results["engine"] == engine, results
    return results


def test_srun_offers_pmix(slurm) -> None:
    """Debian's slurm-wlm ships the PMIx plugin, so Horovod's ranks start with plain srun --mpi=pmix."""
    proc = subprocess.run(["srun", "--mpi=list"], env=slurm.env(), capture_output=True, text=True, timeout=30)
    assert re.search(r"^\s*pmix\s*$", proc.stdout + proc.stderr, re.M), proc.stdout + proc.stderr


def test_horovod_srun_pmix_job_trains(slurm, tmp_path, cache_dir) -> None:
    out = tmp_path / "run"
    job, submitted = slurm.submit(
        "horovod_srun", *LAUNCH_JOB, "--output_dir", str(out), env=launch_env(cache_dir), workdir=tmp_path
    )
    assert "+ sbatch " in submitted and "--ntasks-per-node=2" in submitted and "--gres" not in submitted
    output = assert_completed(slurm.wait(job, timeout=480))
    assert f"+ srun --mpi=pmix --kill-on-bad-exit=1 {BIN}/python -m horovod_train train " in output
    results = check_training(out, "horovod")
    assert results["controller"] == "mpi"
    assert results["param_checksum_per_rank"][0] == results["param_checksum_per_rank"][1]


def test_horovod_mpirun_job_uses_the_allocation_hosts(slurm, tmp_path, cache_dir) -> None:
    out = tmp_path / "run"
    env = launch_env(cache_dir, HVT_MPIRUN_ARGS="--fusion-threshold-mb 16")
    job, _ = slurm.submit("horovod_mpirun", *LAUNCH_JOB, "--output_dir", str(out), env=env, workdir=tmp_path)
    output = assert_completed(slurm.wait(job, timeout=480))
    assert f"-np 2 -H {slurm.host}:2 --fusion-threshold-mb 16 --" in output  # scontrol show hostnames -> -H
    assert "+ mpirun " in output and "-x HOROVOD_FUSION_THRESHOLD" in output
    assert check_training(out, "horovod")["controller"] == "mpi"


def test_ddp_torchrun_job_trains(slurm, tmp_path, cache_dir) -> None:
    from horovod_train.engines import available_engines

    if "ddp" not in available_engines():
        pytest.skip("this checkout has no --engine ddp yet")
    out = tmp_path / "run"
    env = launch_env(cache_dir, HVT_RDZV_PORT=str(free_port()))
    job, _ = slurm.submit("ddp_torchrun", *LAUNCH_JOB, "--output_dir", str(out), env=env, workdir=tmp_path)
    output = assert_completed(slurm.wait(job, timeout=480))
    assert "--nnodes 1 --nproc_per_node 2 " in output and "--rdzv_backend c10d --rdzv_endpoint 127.0.0.1:" in output
    results = check_training(out, "ddp")
    assert results.get("launcher", "torchrun") == "torchrun"


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


# Long enough to be stopped mid-run, with dropout on: exact resume needs every rank's own RNG states.
STOP_JOB = [*LAUNCH_JOB, "--synthetic_num_examples", "2000", "--max_steps", "80", "--logging_steps", "5"]
STOP_JOB += ["--dropout", "0.1"]


def wait_for_steps(out: Path, steps: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    metrics = out / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) * 5 >= steps:
            return
        time.sleep(0.5)
    raise AssertionError(f"{out} did not reach step {steps} within {timeout}s")


@pytest.mark.parametrize(
    ("job", "engine"), [("horovod_srun", "horovod"), ("horovod_mpirun", "horovod"), ("ddp_torchrun", "ddp")]
)
def test_warning_signal_checkpoints_requeues_and_resumes(slurm, tmp_path, cache_dir, job, engine) -> None:
    """What #SBATCH --signal=B:USR1@120 does before a time limit, sent now with scancel: the batch shell
    passes SIGUSR1 to the ranks, they checkpoint and stop, the job requeues itself, and the requeued run
    resumes from that checkpoint and ends with the parameters of an uninterrupted run."""
    from test_checkpoint import max_abs_diff

    def submit(out: Path) -> str:
        env = launch_env(cache_dir, HVT_RDZV_PORT=str(free_port()))
        return slurm.submit(job, *STOP_JOB, "--output_dir", str(out), env=env, workdir=tmp_path)[0]

    reference, stopped = tmp_path / "reference", tmp_path / "stopped"
    assert_completed(slurm.wait(submit(reference), timeout=480))
    job_id = submit(stopped)
    wait_for_steps(stopped, 10, timeout=240)
    started = time.monotonic()
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=slurm.env(), check=True, timeout=30)
    slurm.release_requeued(job_id, timeout=240)
    fields = slurm.wait(job_id, timeout=480)
    output = assert_completed(fields)
    assert fields["Restarts"] == "1", fields
    stop = re.search(r"stopped by SIGUSR1 at step (\d+): saved checkpoint-\1", output)
    assert stop and f"requeueing job {job_id}" in output, output[-4000:]
    assert f"resumed from step {stop[1]}" in output, output[-4000:]
    results = check_training(stopped, engine)
    assert results["global_step"] == 80
    diff = max_abs_diff(reference, stopped)
    print(f"{job}: stopped at step {stop[1]}, requeued and finished in {time.monotonic() - started:.0f}s; "
          f"max-abs parameter difference to the uninterrupted run {diff:.2e}")
    assert diff <= 1e-6
