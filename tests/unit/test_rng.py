"""Each rank's generator states for exact resume: a resume on a node that sees fewer GPUs than the one
that saved the checkpoint must not index devices it lacks (faked CUDA: this machine's torch has none)."""

from __future__ import annotations

import pytest
import torch

from horovod_train.training import rng


class FakeCuda:
    """A node with ``count`` GPUs, each with its own generator state; set_rng_state on a missing device
    fails as CUDA's does."""

    def __init__(self, monkeypatch, count: int, current: int) -> None:
        self.count, self.current = count, current
        self.states = {i: torch.full((16,), i, dtype=torch.uint8) for i in range(count)}
        for name in ("is_available", "device_count", "current_device", "get_rng_state", "set_rng_state",
                     "get_rng_state_all", "set_rng_state_all"):  # fmt: skip
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        return self.current

    def get_rng_state(self, device: int | str = "cuda") -> torch.Tensor:
        return self.states[self.current if device == "cuda" else int(device)].clone()

    def set_rng_state(self, state: torch.Tensor, device: int | str = "cuda") -> None:
        index = self.current if device == "cuda" else int(device)
        if index >= self.count:
            raise RuntimeError("CUDA error: invalid device ordinal")
        self.states[index] = state.clone()

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [self.get_rng_state(i) for i in range(self.count)]

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        for i, state in enumerate(states):
            self.set_rng_state(state, i)


def test_a_rank_saves_only_its_own_devices_generator(monkeypatch):
    FakeCuda(monkeypatch, count=4, current=3)
    assert rng.capture()["cuda"] == [3] * 16


def test_resume_on_a_node_with_one_visible_gpu_restores_the_ranks_own_generator(monkeypatch):
    FakeCuda(monkeypatch, count=8, current=5)  # saved by local rank 5 of a node with 8 GPUs
    saved = rng.capture()
    saved["cuda"] = [7] * 16  # its device's generator had moved on
    node = FakeCuda(monkeypatch, count=1, current=0)  # resumed with one GPU per task (srun --gpus-per-task=1)
    rng.restore(saved)
    assert {i: s.tolist() for i, s in node.states.items()} == {0: [7] * 16}


@pytest.mark.parametrize(("current", "expected"), [(1, 11), (3, None)])
def test_checkpoints_that_saved_every_device_restore_the_current_ones_entry(monkeypatch, current, expected):
    FakeCuda(monkeypatch, count=1, current=0)
    saved = rng.capture()
    saved["cuda"] = [[10] * 16, [11] * 16]  # the earlier format: every visible device's state
    node = FakeCuda(monkeypatch, count=4, current=current)
    rng.restore(saved)
    assert node.states[current].tolist() == [expected if expected is not None else current] * 16
