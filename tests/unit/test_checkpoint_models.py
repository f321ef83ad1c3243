"""Checkpoints of any model the suite trains, tied weights included (BART/T5-style shared embeddings made
the first checkpoint crash: safetensors refuses tensors that share memory)."""

from __future__ import annotations

import pytest
import torch
import transformers

from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory
from horovod_train.training.position import TrainingPosition

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
    "modernbert": (
        "ModernBertConfig",
        dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, pad_token_id=0),
    ),  # fmt: skip
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
    path = ckpt.Checkpoints(RunDirectory(tmp_path), keep=None).save(
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
