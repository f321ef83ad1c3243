"""Decoder tokenizers without a pad token, in one process: padded with EOS on either side, a padded batch's
logits equal each example's alone; a tokenizer with neither pad nor EOS is refused. Every family trained
under Horovod and DDP is in tests/integration/test_model_families.py."""

from __future__ import annotations

import pytest
import torch
from support.jobs import SMALL_JOB
from support.models import DECODER, EOS, FAMILIES, JOB, decoder_tokenizer, model_dir
from transformers import DataCollatorWithPadding

from horovod_train import model as model_lib
from horovod_train.errors import UsageError

assert SMALL_JOB[0] == "--model_name_or_path"

JOB += ["--max_steps", "12", "--synthetic_num_examples", "400", "--logging_steps", "4"]


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
