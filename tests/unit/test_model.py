"""Models saved in half precision (as many hub checkpoints are) load and train with fp32 master weights;
--max_seq_length is capped at what the model and its tokenizer take."""

from __future__ import annotations

import pytest
import torch
from support.model_runs import HALF, tiny_bert

from horovod_train.config.parsing import parse_run_config
from horovod_train.data import synthetic
from horovod_train.models.model import build_model, fit_max_seq_length
from horovod_train.outputs.checksums import param_checksum


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


# ---- --max_seq_length against the model ---------------------------------------------------------------------------
def test_max_seq_length_is_capped_at_the_models_positions_with_a_warning():
    config = parse_run_config(["--max_seq_length", "512", "--pad_to_max_length"])
    warnings: list[str] = []
    fit_max_seq_length(config, warnings.append)
    assert config.data.max_seq_length == 256 and len(warnings) == 1 and "256" in warnings[0]
    config = parse_run_config(["--max_seq_length", "200"])
    fit_max_seq_length(config, warnings.append)
    assert config.data.max_seq_length == 200 and len(warnings) == 1


@pytest.mark.parametrize(("family", "usable"), [("RobertaConfig", 38), ("XLMRobertaConfig", 38), ("BertConfig", 40)])
def test_max_seq_length_is_capped_at_the_positions_a_roberta_can_use(tmp_path, family, usable):
    """RoBERTa's positions count from pad_token_id + 1: of 40 position embeddings (pad_token_id 1, its default)
    a sequence uses at most 38; 40 indexed past the table (IndexError in the embedding). BERT uses all 40."""
    import transformers

    getattr(transformers, family)(max_position_embeddings=40).save_pretrained(tmp_path)
    config = parse_run_config(["--model_name_or_path", str(tmp_path), "--max_seq_length", "40"])
    warnings: list[str] = []
    fit_max_seq_length(config, warnings.append)
    assert config.data.max_seq_length == usable and len(warnings) == (usable < 40)
    assert all("\n" not in w and f"using --max_seq_length {usable}" in w for w in warnings), warnings
