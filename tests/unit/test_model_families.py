"""Decoder tokenizers without a pad token, in one process: padded with EOS on either side, a padded batch's
logits equal each example's alone; a tokenizer with neither pad nor EOS is refused. Every family trained
under Horovod and DDP is in tests/integration/test_model_families.py."""

from __future__ import annotations

import pytest
import torch
import transformers
from support.jobs import SMALL_JOB
from support.models import DECODER, EOS, FAMILIES, JOB, decoder_tokenizer, model_dir
from transformers import DataCollatorWithPadding

from horovod_train.common.errors import UsageError
from horovod_train.models import model as model_lib

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


# Each family's dropout probabilities, as its configuration class in transformers names them.
DROPOUT_FIELDS = {
    "bert": {"hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"},
    "roberta": {"hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"},
    "deberta-v2": {"hidden_dropout_prob", "attention_probs_dropout_prob", "pooler_dropout"},
    "modernbert": {"embedding_dropout", "mlp_dropout", "attention_dropout", "classifier_dropout"},
    "distilbert": {"dropout", "attention_dropout", "qa_dropout", "seq_classif_dropout"},
    "llama": {"attention_dropout"},
    "qwen2": {"attention_dropout"},
}


def dropout_probabilities(model: torch.nn.Module) -> set[float]:
    """Every nn.Dropout's p, and the attention_dropout each attention passes to its attention function."""
    modules = list(model.modules())
    functional = {getattr(m, "attention_dropout", None) for m in modules}
    functional = {value for value in functional if isinstance(value, float)}  # not a module of that name
    return {m.p for m in modules if isinstance(m, torch.nn.Dropout)} | functional


def outputs_in_training_mode(model: torch.nn.Module, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two forward passes of one batch in training mode: equal only if no dropout is on anywhere."""
    ids = torch.randint(5, vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    model.train()
    with torch.no_grad():
        return model(input_ids=ids).logits, model(input_ids=ids).logits


@pytest.mark.parametrize("family", list(DROPOUT_FIELDS))
def test_dropout_sets_every_dropout_of_the_family(tmp_path, family):
    """--dropout with a model directory, with --config_name (weights into it) and with tiny-bert + --config_name
    (its architecture, random init): each of the family's own dropout fields, every nn.Dropout and every
    attention's functional dropout take the value; 0 turns dropout off, 0.3 on."""
    path = str(model_dir(tmp_path, family))
    vocab_size = transformers.AutoConfig.from_pretrained(path).vocab_size
    for p in (0.0, 0.3):
        for name, config_name in ((path, None), (path, path), (model_lib.TINY_BERT, path)):
            model = model_lib.build_model(name, 3, ["a", "b", "c"], vocab_size, seed=0, dropout=p,
                                          config_name=config_name)  # fmt: skip
            assert {field: getattr(model.config, field) for field in DROPOUT_FIELDS[family]} == dict.fromkeys(
                DROPOUT_FIELDS[family], p
            ), (name, config_name)
            assert dropout_probabilities(model) <= {p}
            first, second = outputs_in_training_mode(model, vocab_size)
            assert torch.equal(first, second) == (p == 0.0), (name, config_name, p)


def test_dropout_is_refused_for_a_model_without_dropout(tmp_path):
    transformers.MambaConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1).save_pretrained(tmp_path)
    with pytest.raises(UsageError, match=r"--dropout: MambaConfig \(mamba\) has no dropout setting"):
        model_lib.build_model(model_lib.TINY_BERT, 3, ["a", "b", "c"], 100, seed=0, dropout=0.1,
                              config_name=str(tmp_path))  # fmt: skip


# Families whose positions count from pad_token_id + 1, and families whose do not: tiny, 40 position embeddings.
TINY_ENCODER = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100)
AFTER_PADDING = ["roberta", "xlm-roberta", "camembert", "longformer", "roberta-prelayernorm", "xlm-roberta-xl",
                 "data2vec-text", "ibert", "luke", "markuplm", "mpnet", "esm"]  # fmt: skip
FROM_ZERO = ["bert", "deberta-v2", "modernbert", "distilbert", "electra", "albert", "megatron-bert"]


def embeds(model: torch.nn.Module, length: int) -> bool:
    try:
        with torch.no_grad():
            model(input_ids=torch.full((1, length), 5))
    except (IndexError, RuntimeError):  # an index past the position table (RuntimeError on some kernels)
        return False
    return True


@pytest.mark.parametrize("pad_token_id", [1, 0])
@pytest.mark.parametrize("model_type", AFTER_PADDING + FROM_ZERO)
def test_usable_positions_are_the_longest_sequence_the_model_embeds(model_type, pad_token_id):
    """Of 40 position embeddings: 40 - padding_idx - 1 where positions count from padding_idx + 1 (38 with
    RoBERTa's pad_token_id 1), all 40 elsewhere."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type](**TINY_ENCODER, max_position_embeddings=40, pad_token_id=pad_token_id)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    longest = max(length for length in range(36, 41) if embeds(model, length))
    padding_idx = 1 if model_type == "mpnet" else pad_token_id  # MPNet's code fixes its padding_idx at 1
    expected = 40 - padding_idx - 1 if model_type in AFTER_PADDING else 40
    assert model_lib.usable_positions(config) == longest == expected
