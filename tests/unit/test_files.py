"""Atomically written results and checkpoints get the modes the process umask gives a plain open()/mkdir()."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from horovod_train.common.files import atomic_directory, current_umask, write_json_atomic


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_027() -> Iterator[None]:
    previous = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(previous)


def test_current_umask_reads_without_changing_it(umask_027) -> None:
    assert current_umask() == 0o027
    assert current_umask() == 0o027


def test_atomic_writes_follow_the_umask(tmp_path, umask_027) -> None:
    write_json_atomic(tmp_path / "results.json", {"accuracy": 1.0})
    write_json_atomic(tmp_path / "results.json", {"accuracy": 0.5})  # replacing keeps the mode
    assert mode(tmp_path / "results.json") == 0o640
    with atomic_directory(tmp_path / "checkpoint-1") as tmp:
        (tmp / "weights.bin").write_bytes(b"\0")
        save_file({"w": torch.zeros(2)}, tmp / "model.safetensors")  # safetensors 0.8 writes it 0600
        (tmp / "sub").mkdir(mode=0o700)
        (tmp / "sub" / "run.sh").touch(mode=0o700)
    checkpoint = tmp_path / "checkpoint-1"
    assert mode(checkpoint) == mode(checkpoint / "sub") == mode(checkpoint / "sub" / "run.sh") == 0o750
    assert mode(checkpoint / "weights.bin") == mode(checkpoint / "model.safetensors") == 0o640
    with atomic_directory(tmp_path / "checkpoint-1", replace=True) as tmp:
        (tmp / "weights.bin").write_bytes(b"\1")
    assert mode(tmp_path / "checkpoint-1") == 0o750
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1", "results.json"]
