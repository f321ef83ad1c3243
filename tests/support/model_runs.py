"""Shared by the model tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from horovod_train.data import synthetic
from horovod_train.models.model import train_wordpiece_tokenizer

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
