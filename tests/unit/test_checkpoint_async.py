"""A save beside training (--save_async, engines/state_io.BackgroundWrite) in one process, over a real Gloo process
group of one rank: what is written is the state at the save's step, however training changes it meanwhile, and a
failed write is the future's error. The multi-rank protocol (the manifest once every rank has written, a rank
killed mid-write): tests/integration/test_checkpoint_resharding.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from horovod_train.engines import state_io


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
    background = state_io.BackgroundWrite()
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
    background = state_io.BackgroundWrite()
    missing = tmp_path / "gone" / "model.safetensors"  # its directory removed before the write
    background.add(lambda: state_io.write_pieces(missing, [(0, torch.zeros(2))]))
    completed = []
    writing = background.start(tmp_path, 0, completed.append)
    with pytest.raises(FileNotFoundError):
        writing.result(timeout=60)
    assert completed == []
