"""The architectures the benchmarks build, random-initialised from their configurations: tiny-bert and
bert-base-cased (the core's shapes, horovod_train/models/model.py), a Llama-style decoder of about 0.5B parameters
and tiny-llama, a decoder of tiny-bert's size (bench gpu's padding-free step on the CPU)."""

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


# tiny-llama: tiny-bert's shapes and vocabulary (models/model.py) as a Llama-style decoder.
TINY_SHAPES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "max_position_embeddings")  # fmt: skip
DECODERS = ("tiny-llama", "decoder-0.5b")
TINY_OF = {"bert-base-cased": "tiny-bert", "decoder-0.5b": "tiny-llama"}  # each architecture's small one


def model_config(name: str, num_labels: int = 3) -> Any:
    """A BERT (MODELS) or decoder (DECODERS) architecture's configuration by name."""
    return decoder_config(num_labels, name) if name in DECODERS else bert_config(name, num_labels)


def bert_config(name: str, num_labels: int = 3) -> Any:
    from transformers import BertConfig

    from horovod_train.models.model import BERT_BASE_CASED, TINY_BERT_CONFIG, TINY_VOCAB_SIZE

    if name == "tiny-bert":
        return BertConfig(vocab_size=TINY_VOCAB_SIZE, num_labels=num_labels, **TINY_BERT_CONFIG)
    if name == "bert-base-cased":
        return BertConfig(num_labels=num_labels, **BERT_BASE_CASED)
    raise UsageError(f"unknown benchmark model {name!r}", f"use {' or '.join(MODELS)}")


def decoder_config(num_labels: int = 3, name: str = "decoder-0.5b") -> Any:
    from transformers import LlamaConfig

    from horovod_train.models.model import TINY_BERT_CONFIG, TINY_VOCAB_SIZE

    tiny = {"vocab_size": TINY_VOCAB_SIZE, **{shape: TINY_BERT_CONFIG[shape] for shape in TINY_SHAPES}}
    shapes = tiny if name == "tiny-llama" else DECODER_0_5B
    return LlamaConfig(num_labels=num_labels, pad_token_id=0, **shapes)  # train sets the tokenizer's
