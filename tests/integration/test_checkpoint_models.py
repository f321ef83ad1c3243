"""Checkpoints of any model the suite trains, tied weights included (BART/T5-style shared embeddings made
the first checkpoint crash: safetensors refuses tensors that share memory)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import transformers
from safetensors.torch import load_file
from support.jobs import SMALL_JOB, assert_ok, train_here

SEQ2SEQ = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
               encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64)  # fmt: skip


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
    assert_ok(train_here(cache_dir, *job, "--output_dir", str(full)))
    assert json.loads((full / "run_config.json").read_text())["config_name"] == str(config_dir)
    assert "BartForSequenceClassification" in (full / "config.json").read_text()
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-5", resumed / "checkpoint-5")
    assert_ok(train_here(cache_dir, *job, "--output_dir", str(resumed), "--resume_from_checkpoint", "latest"))
    assert max_abs_diff(full, resumed) == 0.0


def max_abs_diff(a: Path, b: Path) -> float:
    left, right = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert left.keys() == right.keys()
    return max(float((left[k] - right[k]).abs().max()) for k in left)
