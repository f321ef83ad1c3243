"""`doctor` under every launcher: rank 0 alone prints the rank/local rank/host/device map and the build."""

from __future__ import annotations

import re
import socket
import subprocess

import pytest
import torch
from support.jobs import BIN, REPO, assert_ok, base_env, horovodrun, mpirun, run, torchrun

from horovod_train.launching.base import free_port

ROW = re.compile(r"^(?:\[[\d,]+\]<stdout>:)?(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)$", re.MULTILINE)
DOCTOR = [str(BIN / "python"), "-m", "horovod_train", "doctor"]


def as_doctor(cmd: list[str]) -> list[str]:
    """A launcher command from conftest, running `doctor` instead of `train`."""
    cmd = list(cmd)
    cmd[cmd.index("train")] = "doctor"
    return cmd


def check_report(stdout: str, launcher: str, world_size: int, engine: str) -> None:
    assert stdout.count("launcher:") == 1, "only rank 0 prints"
    assert f"launcher: {launcher}, world size {world_size}, joined with engine {engine}" in stdout
    rows = [m.groups() for m in ROW.finditer(stdout)]
    host = socket.gethostname()
    devices = [f"cuda:{r}" if torch.cuda.is_available() else "cpu" for r in range(world_size)]
    rule = "cpu" if not torch.cuda.is_available() else "first" if engine == "single" else "local_rank"
    assert rows == [(str(r), str(r), host, devices[r], rule) for r in range(world_size)], stdout
    assert f"device_rule {rule}: " in stdout
    for fact in ("horovod 0.28.1", "[X] PyTorch", "controllers:       [X] MPI  [X] Gloo", "[X] gloo"):
        assert fact in stdout, fact


def test_plain(capsys):
    """One process under no launcher runs in this one (no start-up to pay: torch is imported here); the module's
    entry point, `python -m horovod_train doctor`, is what every launcher below starts."""
    from horovod_train.cli.main import main

    assert main(["doctor"]) == 0
    check_report(capsys.readouterr().out, "plain", 1, "single")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("launcher", "engine"), [("horovodrun", "horovod"), ("horovodrun --mpi", "horovod"), ("torchrun", "ddp")]
)
def test_under_launcher(launcher, engine, cache_dir):
    """horovodrun --mpi runs mpirun, whose ranks doctor named mpirun (issue 58): it names the command the user ran."""
    cmd = {"horovodrun": horovodrun(2), "horovodrun --mpi": horovodrun(2, controller="--mpi"), "torchrun": torchrun(2)}[
        launcher
    ]
    proc = run(as_doctor(cmd), cache_dir, timeout=180)
    assert_ok(proc)
    check_report(proc.stdout, launcher, 2, engine)


@pytest.mark.slow
def test_under_mpirun_it_checks_horovod_with_the_mpi_controller(cache_dir):
    """mpirun is Horovod's launcher (launch/mpirun.sh, horovodrun --mpi): doctor checks Horovod there unasked."""
    proc = run(as_doctor(mpirun(2)), cache_dir, timeout=180)
    assert_ok(proc)
    check_report(proc.stdout, "mpirun", 2, "horovod")
    assert "(controller mpi)" in proc.stdout


@pytest.mark.slow
def test_an_explicit_engine_wins_over_the_launchers(cache_dir):
    proc = run([*as_doctor(mpirun(2)), "--engine", "ddp"], cache_dir, timeout=180)
    assert_ok(proc)
    check_report(proc.stdout, "mpirun", 2, "ddp")


@pytest.mark.slow
def test_srun_environment(cache_dir):
    """Two processes with the variables srun gives its tasks (no Slurm controller here): torch.distributed
    joins through the Slurm path (scontrol, else SLURM_LAUNCH_NODE_IPADDR)."""
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = base_env(cache_dir) | {
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_TASKS_PER_NODE": "2",
            "SLURM_NODEID": "0",
            "SLURM_JOB_ID": "77",
            "SLURM_JOB_NODELIST": "localhost",
            "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        procs.append(
            subprocess.Popen(DOCTOR, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    outputs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, f"{out}\n{err}"
    check_report(outputs[0][0], "srun", 2, "ddp")
    assert outputs[1][0] == ""
