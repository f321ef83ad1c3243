"""Rank and master discovery from each launcher's environment variables (no process group joined)."""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta

import pytest

from horovod_train.common.errors import UsageError
from horovod_train.engines.joining import check_joins, implied_engine
from horovod_train.engines.specs import names
from horovod_train.launching import LAUNCHERS, environment
from horovod_train.launching.base import free_port
from horovod_train.launching.environment import detect
from horovod_train.launching.srun import expand_tasks_per_node

SRUN = {
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_NODEID": "1",
    "SLURM_JOB_ID": "1234",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}


def test_torchrun():
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    env |= {"MASTER_ADDR": "node7", "MASTER_PORT": "29511", "TORCHELASTIC_RUN_ID": "x"}
    assert detect(env) == environment.DistEnv("torchrun", 3, 1, 4, 2, "node7", 29511)


def test_mpirun_ranks_without_talking_to_mpi():
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "8"}
    env["OMPI_COMM_WORLD_LOCAL_SIZE"] = "4"
    assert detect(env, resolve_master=False) == environment.DistEnv("mpirun", 5, 1, 8, 4)


def test_srun_master_is_the_first_host_from_scontrol(tmp_path, monkeypatch):
    # A stand-in for Slurm's CLI (there is no Slurm controller here): prints the expanded node list.
    scontrol = tmp_path / "scontrol"
    scontrol.write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames gpu[07-08]" ] && printf "gpu07\\ngpu08\\n"\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert detect(SRUN) == environment.DistEnv("srun", 3, 1, 4, 2, "gpu07", 20000 + 1234)


def test_srun_falls_back_to_the_launch_node_address(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol
    env = {**SRUN, "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.5", "MASTER_PORT": "4000"}
    assert detect(env) == environment.DistEnv("srun", 3, 1, 4, 2, "10.0.0.5", 4000)
    with pytest.raises(UsageError, match="Slurm master"):
        detect(SRUN)


def test_an_sbatch_script_itself_is_not_an_srun_task():
    env = {k: v for k, v in SRUN.items() if not k.startswith("SLURM_STEP")}
    assert detect(env).launcher == "plain" and detect(env).world_size == 1


def test_horovodrun_gives_ranks_but_no_master():
    env = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"}
    found = detect(env)
    assert (found.launcher, found.rank, found.world_size, found.master_addr) == ("horovodrun", 1, 2, None)
    with pytest.raises(UsageError, match="no master address"):
        found.export()


def test_plain_python_is_a_world_of_one():
    found = detect({})
    assert (found.launcher, found.rank, found.world_size, found.master_addr) == ("plain", 0, 1, "127.0.0.1")
    assert found.master_port > 0


MPIRUN = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
LAUNCHER_ENVS = {
    "horovodrun": {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"},
    "mpirun": MPIRUN,  # also what `horovodrun --mpi` gives its ranks
    "torchrun": {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "TORCHELASTIC_RUN_ID": "x"},
    "srun": SRUN,
    "plain": {},
}


@pytest.mark.parametrize(
    ("launcher", "engine"),
    [("horovodrun", "horovod"), ("mpirun", "horovod"), ("torchrun", "ddp"), ("srun", "ddp"), ("plain", "single")],
)
def test_each_launcher_implies_an_engine(launcher, engine):
    """What `doctor` joins with unless --engine says: mpirun is Horovod's launcher as much as horovodrun."""
    found = detect(LAUNCHER_ENVS[launcher], resolve_master=False)
    assert (found.launcher, implied_engine(LAUNCHERS[found.launcher])) == (launcher, engine)


def test_mpirun_without_horovod_implies_ddp(monkeypatch):
    monkeypatch.setitem(sys.modules, "horovod", None)  # `import horovod` fails as where it is not installed
    assert implied_engine(LAUNCHERS[detect(MPIRUN, resolve_master=False).launcher]) == "ddp"


def test_bad_launcher_variables_are_usage_errors():
    with pytest.raises(UsageError, match="RANK='x'"):
        detect({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "a"})


def test_expand_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(UsageError):
        expand_tasks_per_node("2(y3)")


def fake_gpus(monkeypatch, count: int) -> list[int]:
    """This machine's torch has no CUDA: fake a node where this process sees ``count`` GPUs."""
    import torch

    current: list[int] = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    return current


ONE_GPU_PER_TASK = {**SRUN, "SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "1"}  # srun --gpus-per-task=1


@pytest.mark.parametrize(
    ("env", "visible", "device", "rule"),
    [
        (ONE_GPU_PER_TASK, 1, "cuda:0", "only_visible"),  # cuda:1 would be an invalid device ordinal
        (SRUN, 4, "cuda:1", "local_rank"),
        ({"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "a"}, 4, "cuda:3", "local_rank"),
        ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a"}, 1, "cuda:0", "only_visible"),
    ],
)
def test_a_rank_pins_its_local_ranks_gpu_or_the_only_one_it_sees(monkeypatch, env, visible, device, rule):
    current = fake_gpus(monkeypatch, visible)
    local_rank = detect(env, resolve_master=False).local_rank
    pinned, chosen_by = environment.pin_cuda_device(local_rank)
    assert (str(pinned), chosen_by, current) == (device, rule, [pinned.index])
    assert rule in environment.DEVICE_RULES


def test_more_local_ranks_than_visible_gpus_is_a_usage_error(monkeypatch):
    current = fake_gpus(monkeypatch, 2)
    with pytest.raises(UsageError, match="local rank 2 but only 2 GPU"):
        environment.pin_cuda_device(detect(SRUN | {"SLURM_LOCALID": "2"}, resolve_master=False).local_rank)
    assert current == []


# Every launcher x engine pair (issue 56): the engines a launcher's world of several ranks can be joined by, written
# out by hand (the spec; the table must agree). horovod under torchrun started 2 separate Horovod jobs of one.
SRUN_PMIX = {**SRUN, "PMIX_RANK": "3"}  # srun --mpi=pmix: Horovod's MPI finds its peers
JOINED_BY = {
    "horovodrun": (LAUNCHER_ENVS["horovodrun"], {"horovod"}),
    "mpirun": (MPIRUN, {"horovod", "ddp", "fsdp", "zero1"}),  # env://: rank 0's address broadcast over MPI
    "torchrun": (LAUNCHER_ENVS["torchrun"], {"ddp", "fsdp", "zero1"}),
    "srun": (SRUN, {"ddp", "fsdp", "zero1"}),  # without PMI each task's Horovod would train alone
    "srun --mpi=pmix": (SRUN_PMIX, {"ddp", "fsdp", "zero1", "horovod"}),
    "plain": ({}, set(names())),  # a world of one
}


def test_the_matrix_covers_every_launcher_row():
    assert {name.split()[0] for name in JOINED_BY} == set(LAUNCHERS)


@pytest.mark.parametrize("engine", names())
@pytest.mark.parametrize("case", JOINED_BY)
def test_a_launchers_world_is_joined_by_its_engines_and_refused_to_the_others_in_one_line(case, engine):
    env, joining = JOINED_BY[case]
    row = detect(env, resolve_master=False)
    assert row.launcher == case.split()[0]
    if engine in joining:
        check_joins(engine, env)
        return
    with pytest.raises(UsageError) as refused:
        check_joins(engine, env)
    line = str(refused.value)
    assert "\n" not in line and f"--engine {engine} " in line and row.launcher in line
    assert f"{row.world_size}" in line.split("; fix:")[0]  # the size of the world it started
    assert any(f"use --engine {name}" in line or f", {name}" in line or f"or {name}" in line for name in joining)


@pytest.mark.parametrize("engine", names())
@pytest.mark.parametrize("case", [case for case in JOINED_BY if case != "plain"])
def test_a_world_of_one_is_joined_by_every_engine_that_finds_a_rendezvous_there(case, engine):
    """One process: one-process engines and Horovod (alone) run; torch.distributed needs the launcher's address."""
    env = {**JOINED_BY[case][0]}
    for name in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"):
        env |= {name: "1"} if name in env else {}
    env |= {name: "0" for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "RANK", "SLURM_PROCID") if name in env}
    env |= {
        name: "0"
        for name in ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID", "PMIX_RANK")
        if name in env
    }
    assert detect(env, resolve_master=False).world_size == 1
    torch_distributed = engine in {"ddp", "fsdp", "zero1"}
    if torch_distributed and case == "horovodrun":
        with pytest.raises(UsageError, match="env:// rendezvous"):
            check_joins(engine, env)
    else:
        check_joins(engine, env)


def stale_torchrun_shell(monkeypatch, port: int) -> None:
    """A shell that still holds an earlier torchrun's rank 0 variables (no torchrun runs: no TORCHELASTIC_RUN_ID)."""
    for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", str(port))


def test_a_rendezvous_whose_peer_never_comes_says_so_while_waiting_and_ends_in_one_line(monkeypatch, capsys):
    """It waited silently for --ddp_timeout (1800 s), then raised DistStoreError ... 1/2 clients joined."""
    from horovod_train.config.run_config import RunConfig, TrainingArguments
    from horovod_train.engines import create_engine, rendezvous

    port = free_port()
    stale_torchrun_shell(monkeypatch, port)
    monkeypatch.setattr(rendezvous, "FIRST_WORD_S", 0.5)  # a real wait, said sooner
    engine = create_engine(RunConfig(training=TrainingArguments(engine="ddp", ddp_timeout=2)))
    with pytest.raises(UsageError) as refused:
        engine.setup()
    assert str(refused.value).startswith(f"1 of 2 ranks never joined at 127.0.0.1:{port} (env://) within")
    assert "`unset RANK LOCAL_RANK WORLD_SIZE MASTER_ADDR MASTER_PORT`" in str(refused.value)
    waiting = capsys.readouterr().err
    assert f"waiting for 1 of 2 ranks at 127.0.0.1:{port} (env://)" in waiting
    assert "not by a running torchrun" in waiting and "unset RANK" in waiting


def test_a_rendezvous_counts_the_ranks_that_came(monkeypatch, capsys):
    """Two real ranks meet (threads of this process, each with its own store connection); rank 1 comes late."""
    from horovod_train.engines import rendezvous

    monkeypatch.setattr(rendezvous, "FIRST_WORD_S", 0.2)
    port = free_port()
    place = rendezvous.Place(f"127.0.0.1:{port} (env://)", [], "mpirun")
    ranks = [environment.DistEnv("mpirun", rank, rank, 2, 2, "127.0.0.1", port) for rank in (0, 1)]
    stores: dict[int, object] = {}

    def join(rank: int) -> None:
        stores[rank] = rendezvous.meet(ranks[rank], place, timedelta(seconds=20))

    first = threading.Thread(target=join, args=(0,))
    first.start()
    time.sleep(1.0)
    join(1)
    first.join(timeout=20)
    assert set(stores) == {0, 1} and stores[0].add(rendezvous.JOINED_KEY, 0) == 2
    assert f"waiting for 1 of 2 ranks at 127.0.0.1:{port} (env://)" in capsys.readouterr().err
