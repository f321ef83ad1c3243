"""Checkpoints of any model the suite trains, tied weights included (BART/T5-style shared embeddings made
the first checkpoint crash: safetensors refuses tensors that share memory)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from conftest import SMALL_JOB, assert_ok, run, train_cmd
from safetensors.torch import load_file

from horovod_train import checkpoint as ckpt
from horovod_train.position import TrainingPosition

SMALL = dict(vocab_size=96, num_labels=3)
ENCODER = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
DECODER = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
               intermediate_size=32, pad_token_id=0)  # fmt: skip
SEQ2SEQ = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
               encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64)  # fmt: skip
FAMILIES = {
    "bert": ("BertConfig", ENCODER),
    "roberta": ("RobertaConfig", ENCODER),
    "xlm-roberta": ("XLMRobertaConfig", ENCODER),
    "deberta-v2": ("DebertaV2Config", ENCODER),
    "modernbert": ("ModernBertConfig", dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                            intermediate_size=32, pad_token_id=0)),  # fmt: skip
    "albert": ("AlbertConfig", {**ENCODER, "embedding_size": 8}),
    "distilbert": ("DistilBertConfig", dict(dim=16, n_layers=1, n_heads=2, hidden_dim=32)),
    "bart (tied embeddings)": ("BartConfig", SEQ2SEQ),
    "t5 (tied embeddings)": ("T5Config", dict(d_model=16, d_ff=32, d_kv=8, num_layers=1, num_heads=2)),
    "llama": ("LlamaConfig", DECODER),
    "qwen2": ("Qwen2Config", DECODER),
}


def build(family: str, seed: int) -> torch.nn.Module:
    name, extra = FAMILIES[family]
    config = getattr(transformers, name)(**SMALL, **extra)
    torch.manual_seed(seed)
    return transformers.AutoModelForSequenceClassification.from_config(config)


def shares_memory(model: torch.nn.Module) -> bool:
    pointers = [t.untyped_storage().data_ptr() for t in model.state_dict().values()]
    return len(set(pointers)) < len(pointers)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_checkpoint_round_trips_every_model_family(tmp_path, family):
    model = build(family, seed=1)
    if "tied" in family:
        assert shares_memory(model), "the family should tie tensors, or this case tests nothing"
    position = TrainingPosition(global_step=3, steps_in_epoch=3)
    compatibility = ckpt.Compatibility("tiny", 3, SMALL["vocab_size"], type(model).__name__, 16)
    path = ckpt.Checkpoints(tmp_path, keep=None).save(
        model, position, compatibility, {}, {"optimizer": {}, "rng": []}, write_loadable=model.config.save_pretrained
    )
    tensors, _, state = ckpt.load_checkpoint(path)
    assert state["global_step"] == 3
    restored = build(family, seed=2)
    restored.load_state_dict(ckpt.with_shared_tensors(tensors, restored))  # strict: every name, tied ones too
    expected = model.state_dict()
    assert all(torch.equal(restored.state_dict()[k], v) for k, v in expected.items())
    assert shares_memory(restored) == shares_memory(model)  # ties are kept, not broken into copies
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(path)  # as save_pretrained would
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in expected.items())


def test_a_tied_model_trains_checkpoints_and_resumes_exactly(tmp_path, cache_dir):
    """BART (shared embeddings, as facebook/bart-large-mnli) through the command line: random init from a
    config directory on the run's own tokenizer (--config_name), a checkpoint, and an exact resume."""
    config_dir = tmp_path / "bart-config"
    # eos 2 is the WordPiece tokenizer's [CLS], one per example: BART classifies from its last eos token.
    transformers.BartConfig(**SEQ2SEQ, pad_token_id=0, bos_token_id=2, eos_token_id=2, dropout=0.0,
                            attention_dropout=0.0).save_pretrained(config_dir)  # fmt: skip
    job = [*SMALL_JOB, "--engine", "single", "--synthetic_num_examples", "300", "--config_name", str(config_dir),
           "--max_steps", "10", "--save_steps", "5", "--save_total_limit", "5"]  # fmt: skip
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    assert_ok(run(train_cmd(*job, "--output_dir", str(full)), cache_dir))
    assert json.loads((full / "run_config.json").read_text())["config_name"] == str(config_dir)
    assert "BartForSequenceClassification" in (full / "config.json").read_text()
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-5", resumed / "checkpoint-5")
    assert_ok(run(train_cmd(*job, "--output_dir", str(resumed), "--resume_from_checkpoint", "latest"), cache_dir))
    assert max_abs_diff(full, resumed) == 0.0


def max_abs_diff(a: Path, b: Path) -> float:
    left, right = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert left.keys() == right.keys()
    return max(float((left[k] - right[k]).abs().max()) for k in left)
