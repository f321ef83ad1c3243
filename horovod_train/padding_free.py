"""Padding-free training batches for decoder classifiers (--padding_free): the examples of a batch end to end
in one row (data/loaders.FlattenedBatches), which the model reads as separate sequences by their position ids
(transformers' packed-sequence masks: sdpa, eager, flex and flash attention), and its classifier reads each
example's last token. An encoder attends both ways and transformers' encoders do not split a row by position
ids: they keep padded batches."""

from __future__ import annotations

import types
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutputWithPast

from horovod_train.errors import UsageError

# The families whose sequence classifier reads the last token through transformers' generic head (a base
# model, then ``score``) and whose base model separates packed sequences by their position ids.
DECODER_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "phi3")


def enable(model: PreTrainedModel) -> None:
    """The model's forward takes flattened batches (``position_ids`` and ``example_ends``) as well as padded ones
    (evaluation's); in place, so that an engine's wrapper and torch.compile see the same module."""
    family = model.config.model_type
    if family not in DECODER_FAMILIES or not hasattr(model, "score"):
        raise UsageError(
            f"--padding_free needs a decoder model ({', '.join(DECODER_FAMILIES)}); {family} attends both ways "
            "over padded batches",
            "drop --padding_free (--length_buckets or --group_by_length pad less)",
        )
    padded = model.forward

    def forward(self: PreTrainedModel, *args: Any, example_ends: torch.Tensor | None = None, **batch: Any) -> Any:
        if example_ends is None:
            return padded(*args, **batch)
        labels = batch.pop("labels", None)
        # no cache: transformers separates packed sequences by their position ids only without one
        hidden = self.base_model(**batch, use_cache=False).last_hidden_state  # [1, tokens, hidden]
        logits = self.score(hidden[0, example_ends])  # each example's last token: [examples, labels]
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, pooled_logits=logits, config=self.config)
        return SequenceClassifierOutputWithPast(loss=loss, logits=logits)

    model.forward = types.MethodType(forward, model)
