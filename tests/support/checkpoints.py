"""A trained run to resume from, and damaged copies of its checkpoints."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from horovod_train.outputs import checkpoint as ckpt
from support.jobs import SMALL_JOB, assert_ok, train_here

# One process (--engine single), so run in the test's: the checks are the checkpoint's, not a launch's.
JOB = ["--engine", "single", *SMALL_JOB, "--synthetic_num_examples", "600"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_dir) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "run"
    assert_ok(train_here(cache_dir, *JOB, "--max_steps", "6", "--save_steps", "3", "--output_dir", str(out)))
    return out


def resume(tmp_path: Path, cache_dir: Path, source: Path, *extra: str):
    """A copy of ``source`` resumed with ``extra``: the run's output, and whether every file it held is as it was."""
    out = tmp_path / "resume"
    shutil.copytree(source, out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    proc = train_here(cache_dir, *JOB, "--max_steps", "9", "--output_dir", str(out), *extra)
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    return proc, before == after


SAVED = ckpt.Compatibility("tiny-bert", 3, 298, "BertForSequenceClassification", 32, tokenizer="t1",
                           label_names=["entailment", "neutral", "contradiction"], train_data="d1", seed=42,
                           group_by_length=False)  # fmt: skip
