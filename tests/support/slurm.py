"""A real SLURM cluster for the tests (Debian's slurm-wlm + munge, config in a temporary directory):
munged, slurmctld and one slurmd per node, children of the test process. tests/system/test_launch_slurm.py runs
one node on localhost; tests/system/test_launch_slurm_two_nodes.py runs two, each slurmd in its own namespaces."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.jobs import read_results
from support.launch import LAUNCH, LAUNCH_JOB, ensure_commands, free_port
from support.machine import Slots

DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
SLURM_CONF = """\
ClusterName=hvt-test
SlurmctldHost={host}({ctld_addr})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/munge.socket
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
# Each node's own temporary directory (PMIx puts its per-step directories there, named by job and step only).
TmpFS={dir}/tmp/%n
# No cgroups in a container: track processes through /proc, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault={mpi_default}
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# 2 CPUs a node whatever the machine has (the jobs are tiny); slurm.conf wins over the hardware.
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
FirstJobId={first_job_id}
{nodes}
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
# Every test cluster's job ids would start at 1, and launch/slurm/common.sh finds a job's processes by its id
# (hvt_signal_local_ranks, on every process of the machine): two test runs' clusters would signal each other's ranks.
# Each cluster takes a block of ids that no other live test process holds.
JOB_ID_BLOCK = 10_000
JOB_ID_BLOCKS = Slots("slurm-job-ids", 6000)  # ids below 60,010,000: SLURM's MaxJobId is 67,043,328
# Long enough to be stopped mid-run, with dropout on: exact resume needs every rank's own RNG states.
STOP_JOB = [*LAUNCH_JOB, "--synthetic_num_examples", "2000", "--max_steps", "80", "--logging_steps", "5"]
STOP_JOB += ["--dropout", "0.1"]


class SlurmCluster:
    """munged + slurmctld + a slurmd per node; everything under one directory. ``nodes`` maps node names to
    addresses (default: this host on 127.0.0.1); ``slurmd_command`` says how a node's slurmd starts."""

    def __init__(
        self, root: Path, nodes: dict[str, str] | None = None, ctld_addr: str = "127.0.0.1", mpi_default: str = "none"
    ) -> None:
        self.root = root
        self.mpi_default = mpi_default  # slurm.conf's MpiDefault: the plugin of every srun without --mpi
        self.host = socket.gethostname().split(".")[0]
        self.nodes = nodes or {self.host: "127.0.0.1"}
        self.ctld_addr = ctld_addr
        self.conf = root / "slurm.conf"
        self.daemons: list[subprocess.Popen] = []
        self.jobs: list[str] = []
        self.job_id_block: int | None = None

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def _daemon(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / f"{name}.out", "w")  # noqa: SIM115 (kept open for the daemon's lifetime)
        self.daemons.append(
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True)
        )

    def slurmd_command(self, node: str) -> list[str]:
        return ["slurmd", "-D", "-f", str(self.conf), "-N", node]

    def write_config(self) -> None:
        for sub in ("munge", "state", "spool", "tmp"):
            (self.root / sub).mkdir(mode=0o700)
        for node in self.nodes:
            (self.root / "spool" / node).mkdir(mode=0o700)
            (self.root / "tmp" / node).mkdir(mode=0o1777)
        nodes = "\n".join(f"NodeName={n} NodeAddr={a} CPUs=2 State=UNKNOWN" for n, a in self.nodes.items())
        self.job_id_block = JOB_ID_BLOCKS.take()
        self.conf.write_text(
            SLURM_CONF.format(
                first_job_id=(self.job_id_block + 1) * JOB_ID_BLOCK,
                host=self.host,
                ctld_addr=self.ctld_addr,
                dir=self.root,
                ctld_port=free_port(),
                slurmd_port=free_port(),
                nodes=nodes,
                mpi_default=self.mpi_default,
            )
        )

    def start(self) -> None:
        self.write_config()
        munge = self.root / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._daemon(
            "munged",
            ["munged", "--foreground", "--force", f"--socket={munge}/munge.socket", f"--key-file={key}"]
            + [f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log", f"--seed-file={munge}/seed"],
        )
        self._wait(lambda: (munge / "munge.socket").exists(), 30, "munged did not create its socket")
        self._daemon("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        for node in self.nodes:
            self._daemon(f"slurmd-{node}", self.slurmd_command(node))
        for node in self.nodes:
            self._wait(lambda n=node: "State=IDLE " in self.scontrol("show", "node", n), 90, f"{node} is not idle")

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
        names = ["munged.out", "slurmctld.log", *(f"slurmd-{n}.{ext}" for n in self.nodes for ext in ("out", "log"))]
        for name in names:
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name}\n" + "\n".join(path.read_text().splitlines()[-25:]))
        return "\n".join(parts)

    def submit(
        self, job: str, *args: str, env: dict[str, str], workdir: Path, nodes: int = 1, tasks: int = 2
    ) -> tuple[str, str]:
        """launch/slurm/submit.sh JOB with ``tasks`` tasks on each of ``nodes`` nodes; returns (job id,
        submit.sh's stdout)."""
        out = workdir / f"{job}-%j.out"
        cmd = [str(LAUNCH / "slurm" / "submit.sh"), job, "--ntasks-per-node", str(tasks), "--cpus-per-task", "1"]
        cmd += ["--nodes", str(nodes)] if nodes > 1 else []
        cmd += ["--output", str(out), "--time", "00:15:00", "--sbatch", f"--chdir={workdir}", "--", *args]
        proc = subprocess.run(
            cmd, cwd=workdir, env={**env, "SLURM_CONF": str(self.conf)}, capture_output=True, text=True, timeout=60
        )
        match = re.search(r"Submitted batch job (\d+)", proc.stdout)
        assert proc.returncode == 0 and match, proc.stdout + proc.stderr
        self.jobs.append(match[1])
        return match[1], proc.stdout

    def fields(self, job_id: str) -> dict[str, str]:
        return dict(re.findall(r"(\w+)=(\S*)", self.scontrol("show", "job", "-o", job_id)))

    def wait(self, job_id: str, timeout: float) -> dict[str, str]:
        """The job's final `scontrol show job` fields (no slurmdbd here, so no sacct)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.fields(job_id)
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
            fields = self.fields(job_id)
            # ... and once the first attempt's step daemons are gone (a new step 0 of the same job collides). The
            # job id is this cluster's own (JOB_ID_BLOCKS): no other test run's step daemon has it.
            steps = subprocess.run(["pgrep", "-f", f"slurmstepd: \\[{job_id}\\."], capture_output=True).stdout
            if fields.get("JobState") == "PENDING" and fields.get("Restarts") == "1" and not steps:
                # slurmd revoked the first run's credential at a time in whole seconds and refuses a
                # credential made in that same second ("Job credential revoked"): start a second later.
                time.sleep(2)
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
        if self.job_id_block is not None:
            JOB_ID_BLOCKS.give_back(self.job_id_block)
            self.job_id_block = None


def require_slurm() -> None:
    ensure_commands({"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client", "munged": "munge"})
    if os.geteuid() != 0:
        pytest.skip("the test cluster's slurmd runs jobs as any user only when started as root")


@contextmanager
def running(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster started, and stopped whatever happens (a failed start included)."""
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def check_training(out: Path, engine: str) -> dict:
    """A 2-rank run of ``engine`` that ended with the same parameters on both ranks."""
    results = read_results(out)
    assert results["world_size"] == 2 and results["engine"] == engine, results
    assert results["param_checksum_per_rank"][0] == results["param_checksum_per_rank"][1], results
    return results


def job_output(fields: dict[str, str]) -> str:
    return Path(fields["StdOut"]).read_text()


def assert_completed(fields: dict[str, str]) -> str:
    output = job_output(fields)
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", f"{fields}\n{output[-4000:]}"
    return output


def wait_for_steps(cluster: SlurmCluster, job_id: str, out: Path, steps: int, timeout: float) -> None:
    """Wait until the job logged ``steps`` steps; fail at once, with its output, if it ended before."""
    deadline = time.monotonic() + timeout
    metrics = out / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) * 5 >= steps:
            return
        fields = cluster.fields(job_id)
        if fields.get("JobState") in DONE:
            raise AssertionError(f"job {job_id} ended before step {steps}: {fields}\n{job_output(fields)[-4000:]}")
        time.sleep(0.5)
    fields = cluster.fields(job_id)
    output = job_output(fields) if Path(fields.get("StdOut", "")).is_file() else "(no output yet)"
    raise AssertionError(
        f"{out} did not reach step {steps} within {timeout}s: {fields}\n{output[-4000:]}\n{cluster.logs()}"
    )


def stop_and_resume(cluster: SlurmCluster, job_id: str, out: Path) -> tuple[dict[str, str], str, str]:
    """Send the job the warning signal once it trained 10 steps (what #SBATCH --signal=B:USR1@120 does before
    a time limit), let the requeued job start at once, wait for it: (final fields, output, the stop step)."""
    wait_for_steps(cluster, job_id, out, 10, timeout=240)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=cluster.env(), check=True, timeout=30)
    cluster.release_requeued(job_id, timeout=240)
    fields = cluster.wait(job_id, timeout=480)
    output = assert_completed(fields)
    assert fields["Restarts"] == "1", fields
    stop = re.search(r"stopped by SIGUSR1 at step (\d+): saved checkpoint-\1", output)
    assert stop and f"requeueing job {job_id}" in output, output[-4000:]
    assert f"resumed from step {stop[1]}" in output, output[-4000:]
    return fields, output, stop[1]


def assert_resumed_exactly(reference: Path, stopped: Path, engine: str, label: str, stop: str, started: float) -> None:
    """The requeued run reached step 80 with the parameters of the uninterrupted one (max-abs <= 1e-6)."""
    from support.checks import max_abs_diff

    assert check_training(stopped, engine)["global_step"] == 80
    diff = max_abs_diff(reference, stopped)
    print(
        f"{label}: stopped at step {stop}, requeued and finished in {time.monotonic() - started:.0f}s; "
        f"max-abs parameter difference to the uninterrupted run {diff:.2e}"
    )
    assert diff <= 1e-6
