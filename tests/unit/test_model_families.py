"""The model families users bring in 2026, each tiny and random-init from transformers' own configuration
classes, saved to a local directory as a downloaded checkpoint would be: encoders (BERT, RoBERTa, XLM-R,
DeBERTa-v2, ModernBERT) and decoder LLM classifiers (Llama, Qwen2, Mistral) whose tokenizers have no pad
token. Each trains under Horovod and DDP (np=2) and its output directory loads in a text-classification
pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from support.jobs import SMALL_JOB
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import DataCollatorWithPadding, PreTrainedTokenizerFast

from horovod_train import model as model_lib
from horovod_train import synthetic
from horovod_train.errors import UsageError

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

JOB = [a for a in SMALL_JOB[2:]]

assert SMALL_JOB[0] == "--model_name_or_path"

JOB += ["--max_steps", "12", "--synthetic_num_examples", "400", "--logging_steps", "4"]


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


def model_dir(root: Path, family: str) -> Path:
    """A checkpoint directory as `save_pretrained` writes one: configuration, random weights, tokenizer."""
    name, fields, padding_side = FAMILIES[family]
    target = root / family
    tokenizer = decoder_tokenizer(padding_side) if padding_side else encoder_tokenizer(root / f"{family}-wordpiece")
    special = {"pad_token_id": tokenizer.pad_token_id} if padding_side is None else {}
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    if padding_side is None:  # the WordPiece tokenizer's [CLS]/[SEP] stand for <s>/</s>
        ids = {"bos_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id}
    config = getattr(transformers, name)(vocab_size=len(tokenizer), num_labels=3, **fields, **special, **ids)
    torch.manual_seed(0)
    transformers.AutoModelForSequenceClassification.from_config(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def test_a_decoder_tokenizer_without_pad_pads_with_eos_and_the_model_pools_the_last_real_token(tmp_path):
    """Llama-style: no pad token. Padded with EOS on either side, each example's logits in a batch are its
    logits alone: the model's pad_token_id is the tokenizer's, so it pools the last token that is not padding."""
    for side in ("right", "left"):
        FAMILIES["probe"] = ("LlamaConfig", DECODER, side)
        try:
            path = model_dir(tmp_path / side, "probe")
        finally:
            del FAMILIES["probe"]
        tokenizer = model_lib.load_tokenizer(str(path))
        assert tokenizer.pad_token == EOS and tokenizer.padding_side == side
        model = model_lib.build_model(str(path), 3, ["a", "b", "c"], len(tokenizer), seed=0,
                                      pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        assert model.config.pad_token_id == tokenizer.pad_token_id
        model.eval()
        pairs = [("Ann put the cup next to the box in the hall .", "Ann put the cup ."), ("Bo ran .", "Bo sat .")]
        encoded = [tokenizer(premise, hypothesis) for premise, hypothesis in pairs]
        batch = DataCollatorWithPadding(tokenizer)(encoded)
        assert batch["attention_mask"].sum(1).tolist() != [batch["input_ids"].shape[1]] * 2, "nothing was padded"
        with torch.no_grad():
            together = model(**batch).logits
            alone = torch.cat([model(**DataCollatorWithPadding(tokenizer)([e])).logits for e in encoded])
        torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_a_tokenizer_with_neither_pad_nor_eos_is_refused(tmp_path):
    bare = decoder_tokenizer("right")
    bare.eos_token = bare.bos_token = None
    bare.save_pretrained(tmp_path)
    with pytest.raises(UsageError, match="neither a pad token nor an EOS token"):
        model_lib.load_tokenizer(str(tmp_path))
