"""--gradient_checkpointing in one process: on in the built model, non-reentrant, refused where unsupported, silent
with LoRA."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers

from horovod_train.common.errors import UsageError
from horovod_train.models import lora
from horovod_train.models.model import enable_gradient_checkpointing


def tiny_bert() -> transformers.PreTrainedModel:
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, num_labels=3)  # fmt: skip
    return transformers.BertForSequenceClassification(config)


def test_gradient_checkpointing_recomputes_non_reentrant_and_gives_the_same_gradients():
    torch.manual_seed(0)
    stored, recomputed = tiny_bert(), tiny_bert()
    recomputed.load_state_dict(stored.state_dict())
    enable_gradient_checkpointing(recomputed)
    layers = [m for m in recomputed.modules() if getattr(m, "gradient_checkpointing", False)]
    assert len(layers) >= 2, "every encoder layer recomputes"
    recompute = {getattr(m, "_gradient_checkpointing_func", None) for m in layers} - {None}
    assert all(f.keywords == {"use_reentrant": False} for f in recompute), recompute
    ids = torch.randint(1, 64, (3, 9))
    labels = torch.tensor([0, 1, 2])
    for model in (stored, recomputed):
        model.train()
        torch.manual_seed(1)  # the same dropout masks (checkpointing replays the generator's state)
        model(input_ids=ids, labels=labels).loss.backward()
    for (name, a), b in zip(stored.named_parameters(), recomputed.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_a_model_without_gradient_checkpointing_is_refused():
    class Plain(torch.nn.Module):
        supports_gradient_checkpointing = False

    with pytest.raises(UsageError, match="Plain does not support gradient checkpointing"):
        enable_gradient_checkpointing(Plain())


def test_gradient_checkpointing_with_lora_trains_without_a_warning():
    """Every rank would print each warning: transformers 5 deprecated gradient_checkpointing_enable (ours to call by
    its new name) and is_gradient_checkpointing (which peft reads when it wraps the model)."""
    model = tiny_bert()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        enable_gradient_checkpointing(model)
        model = lora.wrap(model, lora.LoraOptions(r=4))
        model.train()
        model(input_ids=torch.randint(1, 64, (3, 9)), labels=torch.tensor([0, 1, 2])).loss.backward()
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
    assert model.base_model.model.is_activation_checkpointing
