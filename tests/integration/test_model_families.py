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
from support.jobs import SMALL_JOB, assert_ok, horovodrun, read_results, run, torchrun
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from horovod_train import model as model_lib
from horovod_train import synthetic

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


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_trains_under_horovod_and_ddp_and_loads_in_a_pipeline(tmp_path, cache_dir, family):
    path = model_dir(tmp_path, family)
    for engine, launch in (("horovod", horovodrun), ("ddp", torchrun)):
        out = tmp_path / f"out-{engine}"
        args = ["--model_name_or_path", str(path), *JOB, "--output_dir", str(out)]
        if engine == "ddp":
            args += ["--engine", "ddp"]
        proc = run(launch(2, *args), cache_dir, timeout=400)
        assert_ok(proc)
        results = read_results(out)
        assert results["world_size"] == 2 and len(set(results["param_checksum_per_rank"])) == 1, results
        classify = transformers.pipeline("text-classification", model=str(out), device="cpu")
        pair = {"text": "Ann put the cup next to the box in the hall .", "text_pair": "Ann put the box ."}
        [prediction] = classify([pair])
        assert prediction["label"] in {"entailment", "neutral", "contradiction"}, prediction
