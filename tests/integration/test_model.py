"""Models saved in half precision (as many hub checkpoints are) load and train with fp32 master weights."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from support.jobs import assert_ok, train_here
from support.model_runs import HALF


@pytest.mark.slow
@pytest.mark.parametrize("half", sorted(HALF))
def test_training_a_half_precision_checkpoint_saves_float32(tmp_path, cache_dir, half_models, half) -> None:
    out = tmp_path / "out"
    args = ["--engine", "single", "--model_name_or_path", str(half_models[half]), "--synthetic_num_examples", "600"]
    args += ["--per_device_train_batch_size", "16", "--max_steps", "3", "--disable_tqdm", "--output_dir", str(out)]
    assert_ok(train_here(cache_dir, *args))
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.float32}
