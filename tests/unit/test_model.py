"""Models saved in half precision (as many hub checkpoints are) load and train with fp32 master weights."""

from __future__ import annotations

import pytest
import torch
from support.model_runs import HALF, tiny_bert

from horovod_train import synthetic
from horovod_train.model import build_model, param_checksum


@pytest.mark.parametrize("half", sorted(HALF))
def test_half_precision_checkpoint_loads_as_float32(half_models, half) -> None:
    model = build_model(str(half_models[half]), 3, list(synthetic.LABEL_NAMES), vocab_size=100, seed=0)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_param_checksum_hashes_bfloat16_parameters() -> None:
    model = tiny_bert(100).to(torch.bfloat16)
    before = param_checksum(model)
    assert before == param_checksum(model) and 0 <= before < 2**63
    with torch.no_grad():
        model.classifier.bias[0] += 1
    assert param_checksum(model) != before
