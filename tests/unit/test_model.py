"""Models saved in half precision (as many hub checkpoints are) load and train with fp32 master weights; a
classifier's label names keep their rows; --max_seq_length is capped at what the model and its tokenizer take."""

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


# ---- a pretrained classifier's labels -----------------------------------------------------------------------------
@pytest.mark.parametrize("labels", ["ClassLabel", "names in a file"])
def test_a_classifiers_labels_keep_their_rows_and_ids_when_fine_tuned_further(tmp_path, cache_dir, labels):
    """A classifier trained with its labels in another order than the data's (roberta-large-mnli's CONTRADICTION,
    NEUTRAL, ENTAILMENT; the data's entailment first, sorted names, a ClassLabel's): the run took the data's order, so
    its head's row 0, contradiction, was called entailment from then on (a trained one: accuracy 0.86 -> 0.27 before
    a step). The run takes the model's order, as run_glue.py maps a dataset's labels to the model's ids: after a step
    below float32's resolution every label's logit is the one the model gave it."""
    import json

    import transformers
    from support.jobs import SMALL_JOB, assert_ok, train_here
    from support.models import model_dir

    order = ["CONTRADICTION", "NEUTRAL", "ENTAILMENT"]
    source = model_dir(tmp_path, "bert", id2label=dict(enumerate(order)), label2id={n: i for i, n in enumerate(order)})
    rows = synthetic.generate(40, seed=3)
    data = ["--synthetic_num_examples", "40"]
    if labels == "names in a file":
        named = [{**r, "label": synthetic.LABEL_NAMES[r["label"]]} for r in rows]
        (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in named))
        data = ["--train_file", str(tmp_path / "train.jsonl")]
    out = tmp_path / "out"
    args = [*SMALL_JOB, *data, "--model_name_or_path", str(source), "--engine", "single", "--max_steps", "1",
            "--learning_rate", "1e-12", "--save_strategy", "no", "--output_dir", str(out)]  # fmt: skip
    proc = train_here(cache_dir, *args)
    assert_ok(proc)
    assert "warning:" not in proc.stderr, proc.stderr  # the same labels: nothing to warn of
    before, after = (transformers.AutoModelForSequenceClassification.from_pretrained(d).eval() for d in (source, out))
    assert list(after.config.id2label.values()) == [name.lower() for name in order]
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    batch = tokenizer([r["premise"] for r in rows], [r["hypothesis"] for r in rows], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = before(**batch).logits, after(**batch).logits
    for name in order:
        was, now = logits[0][:, before.config.label2id[name]], logits[1][:, after.config.label2id[name.lower()]]
        assert torch.allclose(was, now, rtol=0, atol=1e-6), name


OTHER_LABELS = {
    "another count": (["negative", "positive"], "its classification head is trained anew"),
    "other names": (["sad", "calm", "happy"], "its head's rows are renamed in that order"),
}


@pytest.mark.parametrize("other", list(OTHER_LABELS))
def test_a_classifier_trained_for_other_labels_is_said_to_lose_its_head(tmp_path, cache_dir, other):
    """A sentiment classifier brought to NLI data (the wrong model, or label column): transformers re-initialized its
    head (another size) or the data's names took its rows, without a word; now one line from rank 0, as run_glue.py
    warns of labels that "don't match the dataset"."""
    import transformers
    from support.jobs import SMALL_JOB, assert_ok, train_here
    from support.models import model_dir

    names, what = OTHER_LABELS[other]
    source = model_dir(tmp_path, "bert")
    config = transformers.AutoConfig.from_pretrained(source)
    config.id2label, config.label2id = dict(enumerate(names)), {n: i for i, n in enumerate(names)}
    transformers.AutoModelForSequenceClassification.from_config(config).save_pretrained(source)
    args = [*SMALL_JOB, "--synthetic_num_examples", "40", "--model_name_or_path", str(source), "--engine", "single",
            "--max_steps", "1", "--save_strategy", "no", "--output_dir", str(tmp_path / "out")]  # fmt: skip
    proc = train_here(cache_dir, *args)
    assert_ok(proc)
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {source} was trained for the labels {', '.join(names)} but the train data's are "
                        f"entailment, neutral, contradiction: {what}"], proc.stderr  # fmt: skip


def test_a_peft_adapter_given_as_the_model_is_named_as_such(tmp_path):
    """A --use_peft run's adapter/ (or any peft save_pretrained) as --model_name_or_path: the fix said "pass a local
    model directory", which the user had done; it names the model the adapter adapts, or the merged one."""
    from peft import LoraConfig, get_peft_model
    from transformers import BertConfig, BertForSequenceClassification

    from horovod_train.common.errors import UsageError

    bert = BertForSequenceClassification(BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                                    intermediate_size=16, vocab_size=100))  # fmt: skip
    get_peft_model(bert, LoraConfig(r=2, target_modules=["query", "value"])).save_pretrained(tmp_path / "adapter")
    with pytest.raises(UsageError, match="adapter holds a peft adapter, not a model: pass the model it adapts"):
        build_model(str(tmp_path / "adapter"), 3, list(synthetic.LABEL_NAMES), vocab_size=100, seed=0)


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
