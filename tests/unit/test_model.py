"""Models saved in half precision (as many hub checkpoints are) load and train with fp32 master weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from horovod_train import synthetic
from horovod_train.model import build_model, param_checksum, train_wordpiece_tokenizer

HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def tiny_bert(vocab_size: int) -> BertForSequenceClassification:
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=len(synthetic.LABEL_NAMES),
    )
    torch.manual_seed(0)
    return BertForSequenceClassification(config)


@pytest.fixture(scope="module")
def half_models(tmp_path_factory) -> dict[str, Path]:
    """A local model directory (tokenizer included) per half-precision dtype, saved as a hub model would be."""
    root = tmp_path_factory.mktemp("half-models")
    rows = synthetic.generate(300)
    train_wordpiece_tokenizer([r[c] for r in rows for c in ("premise", "hypothesis")], root / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    dirs = {}
    for name, dtype in HALF.items():
        dirs[name] = root / name
        tiny_bert(len(tokenizer)).to(dtype).save_pretrained(dirs[name])
        tokenizer.save_pretrained(dirs[name])
        assert {t.dtype for t in load_file(dirs[name] / "model.safetensors").values()} == {dtype}
    return dirs


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
