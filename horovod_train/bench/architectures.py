"""The architectures the benchmarks build, random-initialised from their configurations: tiny-bert and
bert-base-cased (the core's shapes, horovod_train/models/model.py) and a Llama-style decoder of about 0.5B
parameters."""

from __future__ import annotations

from typing import Any

from horovod_train.common.errors import UsageError

MODELS = ("tiny-bert", "bert-base-cased")
# A Llama-style decoder of about 0.5B parameters (0.51B with a 2000-token vocabulary: its transformer body is
# Qwen2.5-0.5B's depth at width 1024, head size 64, full multi-head attention), random init.
DECODER_0_5B = dict(
    vocab_size=2000,
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=16,
    intermediate_size=5504,
    max_position_embeddings=512,
)


def bert_config(name: str, num_labels: int = 3) -> Any:
    from transformers import BertConfig

    from horovod_train.models.model import BERT_BASE_CASED, TINY_BERT_CONFIG, TINY_VOCAB_SIZE

    if name == "tiny-bert":
        return BertConfig(vocab_size=TINY_VOCAB_SIZE, num_labels=num_labels, **TINY_BERT_CONFIG)
    if name == "bert-base-cased":
        return BertConfig(num_labels=num_labels, **BERT_BASE_CASED)
    raise UsageError(f"unknown benchmark model {name!r}", f"use {' or '.join(MODELS)}")


def decoder_config(num_labels: int = 3) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(num_labels=num_labels, pad_token_id=0, **DECODER_0_5B)  # train sets the tokenizer's
