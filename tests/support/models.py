"""Tiny random-init checkpoints of every model family the suite trains, saved as downloaded ones are."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from horovod_train.data import synthetic
from horovod_train.models import model as model_lib
from support.jobs import SMALL_JOB

EOS = "<|endoftext|>"

ENCODER = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)

DECODER = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)

FAMILIES = {
    "bert": ("BertConfig", ENCODER, None),
    "roberta": ("RobertaConfig", ENCODER, None),
    "xlm-roberta": ("XLMRobertaConfig", ENCODER, None),
    "deberta-v2": ("DebertaV2Config", ENCODER, None),
    "modernbert": ("ModernBertConfig", ENCODER, None),
    "llama": ("LlamaConfig", DECODER, "right"),
    "qwen2": ("Qwen2Config", DECODER, "left"),  # Qwen's tokenizers pad on the left
    "mistral": ("MistralConfig", DECODER, "left"),
}

# Families built (tests/unit/test_model_families.py's --dropout) but not trained under every engine.
BUILT_ONLY = {
    "distilbert": ("DistilBertConfig", dict(dim=32, n_layers=1, n_heads=2, hidden_dim=64), None),
}

JOB = [a for a in SMALL_JOB[2:]]


def texts(n: int = 400) -> list[str]:
    return [text for row in synthetic.generate(n, seed=7) for text in (row["premise"], row["hypothesis"])]


def decoder_tokenizer(padding_side: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer as decoder LLMs ship them: an EOS token, no pad token."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(texts(), trainers.BpeTrainer(vocab_size=400, special_tokens=[EOS], show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, bos_token=EOS, padding_side=padding_side)


def encoder_tokenizer(tmp: Path) -> transformers.PreTrainedTokenizerBase:
    model_lib.train_wordpiece_tokenizer(texts(), tmp)
    return transformers.AutoTokenizer.from_pretrained(tmp)


def model_dir(root: Path, family: str, **config: object) -> Path:
    """A checkpoint directory as `save_pretrained` writes one: configuration (``config`` overrides the tiny
    one's fields), random weights, tokenizer."""
    name, fields, padding_side = {**FAMILIES, **BUILT_ONLY}[family]
    target = root / family
    tokenizer = decoder_tokenizer(padding_side) if padding_side else encoder_tokenizer(root / f"{family}-wordpiece")
    special = {"pad_token_id": tokenizer.pad_token_id} if padding_side is None else {}
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    if padding_side is None:  # the WordPiece tokenizer's [CLS]/[SEP] stand for <s>/</s>
        ids = {"bos_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id}
    config = getattr(transformers, name)(
        vocab_size=len(tokenizer), num_labels=3, **{**fields, **special, **ids, **config}
    )
    torch.manual_seed(0)
    transformers.AutoModelForSequenceClassification.from_config(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
