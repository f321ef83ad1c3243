"""Atomically written results and checkpoints get the modes the process umask gives a plain open()/mkdir()."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from support.jobs import SMALL_JOB, assert_ok, run, train_cmd


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.slow
def test_training_outputs_are_group_readable(tmp_path, cache_dir) -> None:
    out = tmp_path / "out"
    args = [*SMALL_JOB, "--synthetic_num_examples", "600", "--max_steps", "4", "--save_steps", "2"]
    proc = run(
        train_cmd("--engine", "single", *args, "--output_dir", str(out)), cache_dir, preexec_fn=lambda: os.umask(0o002)
    )
    assert_ok(proc)
    assert mode(out / "eval_results.json") == 0o664
    assert mode(out / "run_config.json") == 0o664
    assert mode(out / "model.safetensors") == 0o664  # save_pretrained's safetensors file
    checkpoints = sorted(out.glob("checkpoint-*"))
    assert [p.name for p in checkpoints] == ["checkpoint-2", "checkpoint-4"]
    for checkpoint in checkpoints:
        assert mode(checkpoint) == 0o775, checkpoint
        files = list(checkpoint.iterdir())
        assert files and all(p.is_file() for p in files)
        assert {p.name: mode(p) for p in files} == {p.name: 0o664 for p in files}
