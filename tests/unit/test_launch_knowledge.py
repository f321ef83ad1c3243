"""One source of launch knowledge (horovod_train/launching/): the exact command lines its launchers write, with
every option the launch/ scripts, compare, bench and the tests use, and the rank variables a stop signal looks for."""

from __future__ import annotations

import pytest

from horovod_train.common.errors import UsageError
from horovod_train.launching import LAUNCHERS, open_mpi, signalled_rank_variables

mpirun_command = LAUNCHERS["mpirun"].command
horovodrun_command = LAUNCHERS["horovodrun"].command
torchrun_command = LAUNCHERS["torchrun"].command
srun_command = LAUNCHERS["srun"].command

DOCUMENTED = ["-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib"]

NO_OFI = ["-gmca", "btl", "^openib,ofi"]

PROGRAM = ["/opt/my env/bin/python", "-m", "horovod_train", "train", "--output_dir", "runs/a b"]


def test_mpirun_command_exact_argv_not_root() -> None:
    env = {"PATH": "/bin", "HOROVOD_FUSION_THRESHOLD": "1", "HF_HOME": "/hf", "HOME": "/root", "HF_TOKEN_PATH": "/t"}
    assert mpirun_command(PROGRAM, 2, env=env, root=False) == [
        "mpirun", "-np", "2", *DOCUMENTED, *NO_OFI,
        "-x", "PATH", "-x", "HF_HOME", "-x", "HF_TOKEN_PATH", "-x", "HOROVOD_FUSION_THRESHOLD", *PROGRAM,
    ]  # fmt: skip


def test_mpirun_command_as_root_on_hosts_with_ssh_and_interfaces() -> None:
    env = {"PATH": "/bin", "NCCL_DEBUG": "INFO", "LD_LIBRARY_PATH": "/lib64", "OMP_NUM_THREADS": "1"}
    command = mpirun_command(
        PROGRAM, 4, env=env, hosts="a:2,b:2", forward=["MY_VAR", "OTHER=1"], network_interfaces="eth0",
        ssh_port=2222, ssh_identity_file="/keys/id", oversubscribe=True, yield_when_idle=True, root=True,
    )  # fmt: skip
    assert command == [
        "mpirun", "--allow-run-as-root", "-np", "4", "-H", "a:2,b:2", *DOCUMENTED, *NO_OFI,
        "-mca", "btl_tcp_if_include", "eth0", "-mca", "oob_tcp_if_include", "eth0",
        "--oversubscribe", "-mca", "mpi_yield_when_idle", "1", "-mca", "plm_rsh_args", "-p 2222 -i /keys/id",
        "-x", "MY_VAR", "-x", "OTHER=1", "-x", "NCCL_DEBUG", "-x", "PATH", "-x", "LD_LIBRARY_PATH",
        "-x", "OMP_NUM_THREADS", *PROGRAM,
    ]  # fmt: skip


@pytest.mark.parametrize(("euid", "expected"), [(0, True), (1000, False)])
def test_allow_run_as_root_follows_the_effective_user(monkeypatch, euid: int, expected: bool) -> None:
    monkeypatch.setattr(open_mpi.os, "geteuid", lambda: euid)
    assert ("--allow-run-as-root" in mpirun_command(["x"], 2, env={})) == expected


def test_the_ofi_exclusion_is_on_every_mpirun_and_off_only_on_request() -> None:
    assert open_mpi.mpirun_flags() == [*DOCUMENTED, *NO_OFI]
    assert open_mpi.mpirun_flags(exclude_ofi=False) == DOCUMENTED
    assert mpirun_command(["x"], 2, env={}, root=False, exclude_ofi=False) == ["mpirun", "-np", "2", *DOCUMENTED,
                                                                                "-x", "PATH", "x"]  # fmt: skip


def test_horovodrun_command_exact_argv() -> None:
    assert horovodrun_command(PROGRAM, 2) == ["horovodrun", "-np", "2", "--gloo", *PROGRAM]
    knobs = ["--fusion-threshold-mb", "32", "--timeline-filename", "/tmp/a b.json"]
    assert horovodrun_command(
        PROGRAM, 8, controller="mpi", hosts="n1:4,n2:4", ssh_port=12345, ssh_identity_file="/k", options=knobs
    ) == [
        "horovodrun", "-np", "8", "-H", "n1:4,n2:4", "--ssh-port", "12345", "--ssh-identity-file", "/k", "--mpi",
        *knobs, "--mpi-args=-gmca btl ^openib,ofi", *PROGRAM,
    ]  # fmt: skip


def test_horovodrun_refuses_an_unknown_controller() -> None:
    with pytest.raises(UsageError, match="neither gloo nor mpi"):
        horovodrun_command(PROGRAM, 2, controller="nccl")


def test_torchrun_command_exact_argv() -> None:
    assert torchrun_command(PROGRAM, 2, executable="/v/bin/torchrun") == [
        "/v/bin/torchrun", "--standalone", "--nproc_per_node", "2", "--no-python", *PROGRAM,
    ]  # fmt: skip
    module = ["-m", "horovod_train", "train", "--engine", "ddp"]
    assert torchrun_command(module, 4, nnodes=2, rdzv_id="77", rdzv_endpoint="node1:29500") == [
        "torchrun", "--nnodes", "2", "--nproc_per_node", "4", "--rdzv_id", "77", "--rdzv_backend", "c10d",
        "--rdzv_endpoint", "node1:29500", *module,
    ]  # fmt: skip


def test_srun_command_exact_argv() -> None:
    assert srun_command(PROGRAM, mpi="pmix") == ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", *PROGRAM]
    assert srun_command(["torchrun"], 2, ntasks_per_node=1, cpus_per_task=8) == [
        "srun", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=8", "--kill-on-bad-exit=1", "torchrun",
    ]  # fmt: skip
    assert srun_command(["bash"], 2, overlap=True, nodes=2, ntasks_per_node=1) == [
        "srun", "--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash",
    ]  # fmt: skip


def test_signalled_rank_variables() -> None:
    """A stop signal goes to processes with these (SLURM_PROCID: every srun task has it, launchers too)."""
    assert signalled_rank_variables() == [
        "LOCAL_RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
    ]  # fmt: skip
