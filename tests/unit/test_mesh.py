"""The mesh description (engines/mesh.py) and HSDP's option, in-process: the default replicate degree, a bad one
refused in one line, the 2-D mesh's groups and the memory model against a real 2-D sharding (torch's fake process
group: one process plays one rank of eight, no collective runs), and the 2-D mesh's groups giving up on a hung rank
after --ddp_timeout (4 real Gloo ranks, forked). HSDP's training, checkpoints and resharding run in
test_engine_equivalence (its 2 x 2 case and resumes)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support.launch import free_port
from support.processes import wait_beside_a_hung_rank
from torch import nn

from horovod_train.cli.main import main
from horovod_train.common.errors import UsageError
from horovod_train.engines.mesh import ParallelDims
from horovod_train.engines.specs import ENGINES


@pytest.mark.parametrize(("world", "local", "degree", "dims"), [
    (8, 4, 0, (2, 4)),  # two nodes of 4: shard within a node, replicate across
    (4, 4, 0, (1, 4)),  # one node: plain FSDP
    (4, 1, 0, (1, 4)),  # nodes of one rank each: one replica per node would shard nothing
    (6, 4, 0, (1, 6)),  # uneven nodes: no replica per node
    (4, 2, 1, (1, 4)),  # asked: one replica over two nodes
    (8, 8, 2, (2, 4)),  # asked: two replicas on one node
    (1, 1, 0, (1, 1)),
])  # fmt: skip
def test_the_replicate_degree_by_default_is_one_replica_per_node(world, local, degree, dims):
    assert ParallelDims.sharded(world, local, degree) == ParallelDims(*dims)


@pytest.mark.parametrize(("degree", "why"), [(3, "does not divide"), (4, "leaves one rank per shard group of")])
def test_a_replicate_degree_that_shards_nothing_or_does_not_divide_the_world_is_refused(degree, why):
    with pytest.raises(UsageError) as refused:
        ParallelDims.sharded(4, 2, degree)
    assert str(refused.value) == (
        f"--fsdp_replicate_degree {degree} {why} the world of 4 ranks; fix: pass one of 1, 2 (the replicas; each "
        "shards over world/degree ranks), or 0 (one replica per node), or use --engine ddp to replicate everything"
    )


def test_train_refuses_a_bad_replicate_degree_from_rank_0_before_joining(monkeypatch, tmp_path, capsys):
    """Rank 0 of a 4-rank torchrun job: one line, exit 2, before the rendezvous (no rank waits for another: past it,
    the missing ranks would end it after --ddp_timeout in another line)."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TORCHELASTIC_RUN_ID": "x"}  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--engine", "fsdp", "--fsdp_replicate_degree", "3", "--ddp_timeout", "3", "--output_dir",
              str(out)])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --fsdp_replicate_degree 3 does not divide the world of 4 ranks; fix:"), err
    assert err.count("\n") == 1 and not out.exists()


@pytest.fixture
def rank_2_of_8():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=2, world_size=8)
    yield
    dist.destroy_process_group()


def test_hsdp_is_a_2d_mesh_whose_replicas_are_consecutive_ranks_and_the_memory_model_counts_its_shards(rank_2_of_8):
    """Two nodes of four ranks: rank 2 shards with 0-3 (its node) and replicates with 6; its shard of the weights is
    1/4 of the model, which is what the memory model counts (not 1/8: the replicas hold the same rows)."""
    from torch.distributed.fsdp import fully_shard

    mesh = ParallelDims.sharded(8, 4, 0).build("cpu")
    assert mesh.mesh_dim_names == ("replicate", "shard")
    assert mesh["shard"].mesh.tolist() == [0, 1, 2, 3] and mesh["replicate"].mesh.tolist() == [2, 6]
    model = nn.Sequential(nn.Linear(16, 8), nn.Linear(8, 4))
    params = sum(p.numel() for p in model.parameters())
    for module in [*model, model]:
        fully_shard(module, mesh=mesh)
    held = sum(p.to_local().numel() for p in model.parameters())
    fsdp = ENGINES["fsdp"].memory
    # Every tensor's rows divide by 4 here: no padding, so the held shard is exactly the model's quarter.
    assert fsdp.state_bytes(params, params, 8, replicate_degree=2) == 16 * held == 16 * params / 4
    largest = max(p.numel() for p in model.parameters())  # the final output gathers one tensor at a time
    assert fsdp.save_gather_bytes(params, params, 8, replicate_degree=2, largest=largest) == 4 * 16 * 8
    assert all(isinstance(p.to_local(), torch.Tensor) and p.device_mesh is mesh for p in model.parameters())


def hsdp_rank(rank: int, store: str, report: str) -> None:
    """One of 4 real Gloo ranks with --ddp_timeout 2 on HSDP's 2 x 2 mesh: rank 3 hangs (alive, silent, as a stopped
    node), rank 2 all-reduces over its shard group {2, 3} and reports how long it waited."""
    import os
    import time
    from datetime import timedelta

    timeout = timedelta(seconds=2)
    dist.init_process_group("gloo", store=dist.FileStore(store, 4), rank=rank, world_size=4, timeout=timeout)
    mesh = ParallelDims(2, 2).build("cpu", timeout)
    if rank == 3:
        time.sleep(120)  # ended by the test once rank 2 has reported
    if rank == 2:
        started = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1), group=mesh["shard"].get_group())
            outcome = "completed"
        except RuntimeError as error:
            outcome = str(error).splitlines()[0]
        with open(report, "w") as f:
            f.write(f"{time.monotonic() - started:.1f} {outcome}")
    os._exit(0)  # no teardown: the hung rank would hold it


def test_hsdp_collectives_give_up_on_a_hung_rank_after_the_ddp_timeout(tmp_path):
    """A 2-D mesh's groups wait --ddp_timeout for a rank, as the default group does (torch's init_device_mesh gave
    them its own 30 minutes: a hung rank held every HSDP rank that long whatever --ddp_timeout said)."""
    waited, outcome = wait_beside_a_hung_rank(hsdp_rank, 4, waiting=2, hung=3, tmp_path=tmp_path)
    assert waited < 15 and "completed" not in outcome, (waited, outcome)
