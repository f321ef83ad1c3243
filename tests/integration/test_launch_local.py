"""The launch/ scripts on this machine: shellcheck, one-line input errors, real 2-rank trainings through
launch/horovodrun_local.sh and launch/mpirun.sh with Horovod knobs passed through to the ranks (the mpirun.sh job
then stopped by SIGUSR1 through the script, as a pod's stop does), and the relay the scripts run their launcher
under (launch/error_last.py): signals reach the launcher, and it is no rank."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.jobs import BIN, REPO, assert_ok, read_results
from support.launch import (
    LAUNCH,
    LAUNCH_JOB,
    assert_usage_error,
    effective_command,
    ensure_commands,
    launch_env,
    printed_program,
    run_script,
)
from support.processes import wait_for

from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory
from horovod_train.training.stopping import STOPPED_EXIT_CODE

SHELL_SCRIPTS = sorted(
    str(path.relative_to(REPO))
    for pattern in ("launch/*.sh", "launch/slurm/*.sh", "launch/slurm/*.sbatch", "scripts/*.sh", "docker/*.sh")
    for path in REPO.glob(pattern)
)


def test_shell_scripts_are_shellcheck_clean() -> None:
    ensure_commands({"shellcheck": "shellcheck"})
    assert len(SHELL_SCRIPTS) >= 14, SHELL_SCRIPTS
    # -x follows the `source`d helpers (their paths are relative to the repository root).
    proc = subprocess.run(["shellcheck", "-x", *SHELL_SCRIPTS], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _no_slurm_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith("SLURM_")}


BAD_INPUT = [
    ("horovodrun_local.sh", ["-np", "0"], {}, "-np needs a whole number in 1..1000000"),
    ("horovodrun_local.sh", ["-np", "99999999999999999999"], {}, "-np needs a whole number in 1..1000000"),
    ("horovodrun_local.sh", ["-np"], {}, "-np needs a value"),
    ("horovodrun_local.sh", ["-H", "a:1"], {}, "use launch/horovodrun_multihost.sh"),
    ("horovodrun_local.sh", ["--config", "configs/demo.yaml"], {}, "training arguments go after --"),
    ("horovodrun_local.sh", ["--fusion-threshold-mb", "lots"], {}, "--fusion-threshold-mb needs a whole number"),
    ("horovodrun_local.sh", ["--cycle-time-ms", "-1"], {}, "--cycle-time-ms needs a number"),
    ("horovodrun_local.sh", ["--timeline-filename", "/no/such/dir/t.json"], {}, "directory /no/such/dir"),
    ("horovodrun_local.sh", ["--network-interfaces", "nosuchnic0"], {}, "interface nosuchnic0 does not exist"),
    ("horovodrun_local.sh", [], {"HVT_PYTHON": "/no/such/python"}, "HVT_PYTHON=/no/such/python is not"),
    ("horovodrun_multihost.sh", [], {}, "no hosts given"),
    ("horovodrun_multihost.sh", ["-H", "a:1,b"], {}, "-H entry 'b' is not host:slots"),
    ("horovodrun_multihost.sh", ["-H", "a:1,b:1", "-np", "3"], {}, "-np 3 is more than the 2 slots"),
    ("horovodrun_multihost.sh", ["-H", "a:1", "-np", "9999999999999999999999"], {}, "-np needs a whole number"),
    ("horovodrun_multihost.sh", ["-H", "a:99999999999999999999"], {}, "is not host:slots"),
    ("horovodrun_multihost.sh", ["-H", "a:1", "--ssh-identity-file", "{spaced_key}"], {}, "has a space"),
    ("horovodrun_multihost.sh", ["-H", "a:1", "--hostfile", "hosts"], {}, "both -H and --hostfile"),
    ("horovodrun_multihost.sh", ["--hostfile", "/no/such/hostfile"], {}, "hostfile /no/such/hostfile does not exist"),
    ("horovodrun_multihost.sh", ["--hostfile", "{bad_hostfile}"], {}, "line 2 of hostfile"),
    ("horovodrun_multihost.sh", ["-H", "a:1", "--ssh-identity-file", "/no/key"], {}, "--ssh-identity-file /no/key"),
    ("horovodrun_multihost.sh", ["-H", "a:1", "--ssh-port", "ssh"], {}, "--ssh-port needs a whole number"),
    ("mpirun.sh", ["-np", "two"], {}, "-np needs a whole number in 1..1000000"),
    ("mpirun.sh", ["--ssh-identity-file", "{spaced_key}"], {}, "has a space"),
    ("mpirun.sh", ["--fusion-threshold-mb", "99999999999999999999"], {}, "needs a whole number in 0..1048576"),
    ("mpirun.sh", ["-x", "1BAD"], {}, "-x 1BAD is not VAR or VAR=value"),
    ("mpirun.sh", ["-H", "a:1", "--hostfile", "{bad_hostfile}"], {}, "both -H and --hostfile"),
    ("mpirun.sh", ["--autotune-log-file", "/no/such/dir/a.csv"], {}, "directory /no/such/dir"),
    ("mpirun.sh", ["--bogus"], {}, "unknown launcher option '--bogus'"),
    ("discover_hosts.sh", [], {"HVT_HOSTS_FILE": "/no/such/hosts"}, "hosts file /no/such/hosts does not exist"),
    ("discover_hosts.sh", [], {"HVT_HOSTS_FILE": "{bad_hostfile}"}, "line 2 of"),
    ("discover_hosts.sh", [], {"HVT_HOSTS_FILE": "{empty_hostfile}"}, "lists no hosts"),
    ("slurm/submit.sh", [], {}, "no job given"),
    ("slurm/submit.sh", ["horovod_nope"], {}, "unknown job 'horovod_nope'"),
    ("slurm/submit.sh", ["horovod_srun", "--gpus-per-node", "4", "--ntasks-per-node", "2"], {}, "one task per GPU"),
    ("slurm/submit.sh", ["horovod_srun", "--nodes", "two"], {}, "--nodes needs a whole number"),
    ("slurm/submit.sh", ["horovod_srun", "--nodes", "99999999999999999999"], {}, "--nodes needs a whole number"),
    ("slurm/horovod_srun.sbatch", [], {}, "not inside a SLURM job"),
    ("slurm/horovod_mpirun.sbatch", [], {}, "not inside a SLURM job"),
    ("slurm/ddp_torchrun.sbatch", [], {}, "not inside a SLURM job"),
    ("slurm/horovod_apptainer.sbatch", [], {}, "not inside a SLURM job"),
    ("../docker/entrypoint.sh", ["true"], {"HVT_SSHD": "1", "SSH_PORT": "ssh"}, "SSH_PORT 'ssh' is not a port"),
]


@pytest.mark.parametrize(
    ("script", "args", "env", "needle"), BAD_INPUT, ids=[f"{s}:{' '.join(a) or e}" for s, a, e, _ in BAD_INPUT]
)
def test_bad_input_is_one_line_exit_2(script, args, env, needle, tmp_path, cache_dir) -> None:
    bad_hostfile = tmp_path / "hosts"
    bad_hostfile.write_text("node1 slots=2\nnode2 slots two\n")
    (tmp_path / "empty-hosts").write_text("# being rewritten\n\n")
    (tmp_path / "a key").write_text("not a key")
    places = {"{bad_hostfile}": bad_hostfile, "{empty_hostfile}": tmp_path / "empty-hosts",
              "{spaced_key}": tmp_path / "a key"}  # fmt: skip

    def fill(value: str) -> str:
        for place, path in places.items():
            value = value.replace(place, str(path))
        return value

    full_env = _no_slurm_env(launch_env(cache_dir, **{k: fill(v) for k, v in env.items()}))
    proc = run_script(script, *map(fill, args), cwd=tmp_path, env=full_env, timeout=60)
    assert_usage_error(proc, needle)


def test_secrets_are_not_put_on_gloo_command_lines() -> None:
    """horovodrun --gloo starts ranks as `env VAR=value ... python`, through ssh on other hosts: a token in the
    environment would be on command lines every user of every host can read."""
    secrets = {"HF_TOKEN": "hf_s3cret", "WANDB_API_KEY": "k", "AWS_SECRET_ACCESS_KEY": "a",
               "MLFLOW_TRACKING_PASSWORD": "p", "hf_token": "lower"}  # fmt: skip
    kept = {"HF_TOKEN_PATH": "/secrets/hf", "TOKENIZERS_PARALLELISM": "false", "HF_HOME": "/hf", "NCCL_DEBUG": "WARN"}
    script = "source launch/lib.sh && hvt_drop_secrets && env"
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, env={**os.environ, **secrets, **kept},
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    left = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line and not line.startswith("["))
    assert not set(secrets) & set(left) and "hf_s3cret" not in proc.stdout
    assert all(left.get(name) == value for name, value in kept.items())
    note = next(line for line in proc.stdout.splitlines() if line.startswith("[launch] not passed"))
    assert all(name in note for name in secrets)


def _check_two_rank_run(out: Path, controller: str) -> None:
    results = read_results(out)
    assert results["world_size"] == 2 and results["engine"] == "horovod", results
    assert results["controller"] == controller
    assert results["param_checksum_per_rank"][0] == results["param_checksum_per_rank"][1]


@pytest.mark.slow
def test_horovodrun_local_trains_with_horovod_knobs(tmp_path, cache_dir) -> None:
    out, timeline, autotune = tmp_path / "run", tmp_path / "timeline.json", tmp_path / "autotune.csv"
    knobs = ["--fusion-threshold-mb", "32", "--cycle-time-ms", "2", "--timeline-filename", str(timeline)]
    knobs += ["--autotune", "--autotune-log-file", str(autotune)]
    proc = run_script(
        "horovodrun_local.sh",
        "-np",
        "2",
        *knobs,
        "--",
        *LAUNCH_JOB,
        "--output_dir",
        str(out),
        cwd=tmp_path,
        env=launch_env(cache_dir),
        timeout=420,
    )
    assert_ok(proc)
    command = effective_command(proc.stdout, "horovodrun")
    assert command.startswith(f"+ horovodrun -np 2 --gloo {' '.join(knobs)} ")
    assert printed_program(proc.stdout, "horovodrun") == str(BIN / "horovodrun")  # runs as printed, PATH or not
    assert "-m horovod_train train --synthetic_num_examples 600" in command
    _check_two_rank_run(out, "gloo")
    # The knobs reached the ranks: rank 0 wrote Horovod's timeline and the autotuner's log.
    assert "ALLREDUCE" in timeline.read_text()
    assert "tensor_fusion_threshold" in autotune.read_text().splitlines()[0]


def catches(pid: int, sig: signal.Signals) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.MULTILINE)[1], 16)
    return bool(caught >> (sig - 1) & 1)


def test_the_relay_of_the_launch_scripts_is_not_taken_for_a_training_rank(tmp_path) -> None:
    """launch/error_last.py catches SIGUSR1 to pass it on to its launcher: the stop of a pod or a SLURM job
    (launch/ranks.sh) must not take it for a rank, and signal its horovodrun, which dies of SIGUSR1."""
    rank_code = "import signal, time; signal.signal(signal.SIGUSR1, lambda *a: None); time.sleep(120)"
    relay = subprocess.Popen([sys.executable, str(LAUNCH / "error_last.py"), "sleep", "120"])
    rank = subprocess.Popen([sys.executable, "-c", rank_code])
    try:
        for pid in (relay.pid, rank.pid):
            wait_for(lambda p=pid: catches(p, signal.SIGUSR1), 60, f"process {pid} to catch SIGUSR1")
        script = f"source launch/ranks.sh; in_scope() {{ [ $1 = {relay.pid} ] || [ $1 = {rank.pid} ]; }}; "
        script += "hvt_training_ranks in_scope"
        found = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert found.returncode == 0, found.stderr
        assert found.stdout.split() == [str(rank.pid)]
    finally:
        for process in (relay, rank):
            process.kill()
            process.wait()


@pytest.mark.slow
def test_mpirun_script_trains_with_documented_flags_and_horovod_env_and_passes_sigusr1_to_the_ranks(
    tmp_path, cache_dir
) -> None:
    """One mpirun.sh job: Horovod's documented flags and the HOROVOD_* settings reach the ranks (-x); then what a pod's
    stop does (launch/k8s/pod.sh run --forward USR1 -- launch/mpirun.sh): the script passes SIGUSR1 on to mpirun,
    which hands it to every rank; they checkpoint and exit 75."""
    out, timeline = tmp_path / "run", tmp_path / "timeline.json"
    env = launch_env(cache_dir, HOROVOD_CACHE_CAPACITY="512", LD_LIBRARY_PATH=str(tmp_path))
    knobs = ["--cycle-time-ms", "3", "--timeline-filename", str(timeline)]
    job_args = [*LAUNCH_JOB, "--synthetic_num_examples", "3000", "--max_steps", "400", "--logging_steps", "5"]
    job = subprocess.Popen([str(LAUNCH / "mpirun.sh"), "-np", "2", *knobs, "--", *job_args, "--output_dir", str(out)],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: (out / "metrics.jsonl").exists(), 240, "the first logged steps")
        job.send_signal(signal.SIGUSR1)
        output, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == STOPPED_EXIT_CODE, output[-3000:]
    step = ckpt.verify_checkpoint(RunDirectory(out).checkpoints()[-1])["global_step"]
    assert 0 < step < 400 and f"stopped by SIGUSR1 at step {step}: saved checkpoint-{step}" in output, output[-3000:]

    command = effective_command(output, "mpirun")
    # Horovod's documented flags, Open MPI's libfabric BTL excluded (the mpirun row of horovod_train/launching/).
    assert "-bind-to none -map-by slot -mca pml ob1 -mca btl '^openib' -gmca btl '^openib,ofi'" in command, command
    assert "-np 2" in command and "-x NCCL_DEBUG -x PATH" in command, command
    exported = ["LD_LIBRARY_PATH", "HOROVOD_CACHE_CAPACITY", "HOROVOD_CYCLE_TIME", "HOROVOD_TIMELINE"]
    for name in [*exported, "HOROVOD_TRAIN_CACHE"]:
        assert f"-x {name}" in command, (name, command)
    assert ("--allow-run-as-root" in command) == (os.geteuid() == 0)
    # The ranks trained as one Horovod job under the MPI controller (run_config.json: rank 0's engine, at the
    # start); that they stay identical under mpirun is tests/integration/test_horovod_integration.py's.
    config = json.loads((out / "run_config.json").read_text())
    assert (config["world_size"], config["engine"], config["controller"]) == (2, "horovod", "mpi"), config
    assert "ALLREDUCE" in timeline.read_text()  # HOROVOD_TIMELINE reached rank 0 through -x
