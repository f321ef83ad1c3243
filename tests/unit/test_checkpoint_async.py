"""A save beside training (--save_async, engines/state_io.BackgroundWrite) in one process, over a real Gloo process
group of one rank: what is written is the state at the save's step, however training changes it meanwhile, and a
failed write is the future's error; the engine's shutdown ends the writes' group, its threads joined. The
multi-rank protocol (the manifest once every rank has written, a rank killed mid-write):
tests/integration/test_checkpoint_resharding.py."""

from __future__ import annotations

import gc
import os
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from support.launch import free_port
from support.processes import wait_beside_a_hung_rank

from horovod_train.config.parsing import parse_run_config
from horovod_train.engines import create_engine, state_io


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_what_a_background_write_writes_is_the_state_when_it_was_staged(one_rank, tmp_path):
    weights = {"w": torch.arange(12.0).reshape(4, 3), "b": torch.ones(3)}
    moments = {0: {"exp_avg": torch.full((4, 3), 2.0), "step": torch.tensor(7.0)}}
    staged = {name: tensor.clone() for name, tensor in weights.items()}
    staged_moment = moments[0]["exp_avg"].clone()
    background = state_io.BackgroundWrite(dist.group.WORLD)
    state_io.write_model_rows(weights, tmp_path / "model.safetensors", True, lambda: None, background)
    state_io.save_optimizer_shards(moments, tmp_path / state_io.OPTIMIZER_DIR, background)
    with torch.no_grad():  # training goes on: the optimizer steps the tensors in place
        for tensor in [*weights.values(), moments[0]["exp_avg"]]:
            tensor.add_(100.0)
    digests = background.start(tmp_path, 0, lambda written: written).result(timeout=60)
    assert set(digests) == {"optimizer/__0_0.distcp", "optimizer/.metadata"}
    model = load_file(tmp_path / "model.safetensors")
    assert all(torch.equal(model[name], staged[name]) for name in staged)
    saved = state_io.read_whole_optimizer(tmp_path / state_io.OPTIMIZER_DIR, [])["state"]
    assert torch.equal(saved[0]["exp_avg"], staged_moment) and float(saved[0]["step"]) == 7.0


def test_a_failed_background_write_is_the_futures_error_and_nothing_is_completed(one_rank, tmp_path):
    background = state_io.BackgroundWrite(dist.group.WORLD)
    missing = tmp_path / "gone" / "model.safetensors"  # its directory removed before the write
    background.add(lambda: state_io.write_pieces(missing, [(0, torch.zeros(2))]))
    completed = []
    writing = background.start(tmp_path, 0, completed.append)
    with pytest.raises(FileNotFoundError):
        writing.result(timeout=60)
    assert completed == []


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_the_engines_shutdown_ends_the_background_writes_group_and_joins_its_threads(monkeypatch, tmp_path):
    """A Gloo group's worker threads are joined only when its last reference goes (destroy_process_group shuts it
    down, no more): kept past the shutdown, they were joined at the interpreter's teardown (the suspect of a rank
    that once died at exit after its last save). One fsdp rank, as torchrun starts it."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TORCHELASTIC_RUN_ID": "x"}  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    engine = create_engine(parse_run_config(["--engine", "fsdp", "--output_dir", str(tmp_path / "out")]))
    started = threads()
    with engine.running():
        before = threads()
        background = engine.background_write()
        assert engine.background_write().group is background.group  # one group for every save of the run
        grown = threads() - before
        group = weakref.ref(background.group)
        del background
    gc.collect()
    assert grown > 0 and group() is None
    assert threads() <= min(before, started)  # every group's workers are gone, not waiting for the teardown


def background_rank(rank: int, store: str, report: str) -> None:
    """One of 2 real Gloo ranks of an fsdp engine with --ddp_timeout 2: rank 1 hangs (alive, silent, as a stopped
    node), rank 0 gathers over the background writes' group and reports how long it waited."""
    import time
    from datetime import timedelta

    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                            timeout=timedelta(seconds=2))  # fmt: skip
    engine = create_engine(parse_run_config(["--engine", "fsdp", "--ddp_timeout", "2"]))
    background = engine.background_write()
    if rank == 1:
        time.sleep(120)  # ended by the test once rank 0 has reported
    started = time.monotonic()
    try:
        background.gather("digests")
        outcome = "completed"
    except RuntimeError as error:
        outcome = str(error).splitlines()[0]
    Path(report).write_text(f"{time.monotonic() - started:.1f} {outcome}")
    os._exit(0)  # no teardown: the hung rank would hold it


def test_a_background_write_gives_up_on_a_hung_rank_after_the_ddp_timeout(tmp_path):
    """The background writes' group waits --ddp_timeout for a rank, as the default group does (it had torch's own
    30 minutes: a write beside training held a rank that long whatever --ddp_timeout said)."""
    waited, outcome = wait_beside_a_hung_rank(background_rank, 2, waiting=0, hung=1, tmp_path=tmp_path)
    assert waited < 15 and "completed" not in outcome, (waited, outcome)
