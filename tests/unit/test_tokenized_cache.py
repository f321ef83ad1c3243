"""The tokenized-data cache and a checkpoint's tokenizer check know data by what its token ids depend on
(issue 34): the tokenizer's vocabulary, normalizer, post-processor, added tokens and settings, the length,
the padding, the text columns and the data's content; not by where the tokenizer was loaded from."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import BertTokenizer

from horovod_train.config.parsing import parse_run_config
from horovod_train.data import synthetic
from horovod_train.data.columns import text_columns
from horovod_train.data.splits import load_raw_datasets
from horovod_train.data.tokenize import encoder, tokenized_cache_path, tokenizer_digest
from horovod_train.engines.single import SingleEngine
from horovod_train.models.model import load_tokenizer, prepare_tiny_tokenizer
from horovod_train.training.build import prepare_data
from horovod_train.training.rank_zero import RankZero

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "The", "lamp", "Lamp", "mov", "##es", "cafe", "café",
         "is", "here", "a", "dog", "runs"]  # fmt: skip
SWAPPED = [*WORDS[:5], "The", "the", *WORDS[7:]]  # two ids exchanged
PREMISES = ["The Lamp moves", "the café is here", "a dog runs the lamp moves here", "The dog is here",
            "Lamp", "the cafe runs a dog"]  # fmt: skip
HYPOTHESES = ["a dog", "The café moves", "here", "the lamp is The Lamp", "runs", "a cafe"]


@dataclasses.dataclass(frozen=True)
class Inputs:
    """One run's inputs to its tokenized data. Those below ``# not the ids`` cannot change a token id."""

    lowercase: bool = False
    strip_accents: bool = False
    vocabulary: tuple[str, ...] = tuple(WORDS)
    added_token: str | None = None
    pair_type_id: int = 1
    truncation_side: str = "right"
    token_type_ids: bool = True
    max_seq_length: int = 64
    pad: bool = False
    padding_side: str = "right"
    pad_token: str = "[PAD]"
    columns: tuple[str, ...] = ("premise", "hypothesis")
    premise_changed: bool = False
    label_names: tuple[str, ...] = ("no", "yes")
    # not the ids
    model_max_length: int = 512
    called_before: bool = False
    name_or_path: str = "here"


NOT_THE_IDS = ("model_max_length", "called_before", "name_or_path")
VALUES = {  # each input's values, the first Inputs' default
    "lowercase": [False, True],
    "strip_accents": [False, True],
    "vocabulary": [tuple(WORDS), tuple(SWAPPED)],
    "added_token": [None, "moves", "dog runs"],
    "pair_type_id": [1, 0],
    "truncation_side": ["right", "left"],
    "token_type_ids": [True, False],
    "max_seq_length": [64, 5, 8],
    "pad": [False, True],
    "padding_side": ["right", "left"],
    "pad_token": ["[PAD]", "[MASK]"],
    "columns": [("premise", "hypothesis"), ("premise",), ("hypothesis", "premise")],
    "premise_changed": [False, True],
    "label_names": [("no", "yes"), ("yes", "no")],
    "model_max_length": [512, 10**30],
    "called_before": [False, True],
    "name_or_path": ["here", "/elsewhere/copy"],
}


def tokenizer_of(inputs: Inputs) -> BertTokenizer:
    backend = Tokenizer(models.WordPiece({w: i for i, w in enumerate(inputs.vocabulary)}, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=inputs.lowercase, strip_accents=inputs.strip_accents)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    outputs = ["input_ids", *(["token_type_ids"] if inputs.token_type_ids else []), "attention_mask"]
    tokenizer = BertTokenizer(
        tokenizer_object=backend, do_lower_case=inputs.lowercase, strip_accents=inputs.strip_accents,
        truncation_side=inputs.truncation_side, padding_side=inputs.padding_side, pad_token=inputs.pad_token,
        model_input_names=outputs, model_max_length=inputs.model_max_length, name_or_path=inputs.name_or_path,
    )  # fmt: skip
    cls, sep, type_id = inputs.vocabulary.index("[CLS]"), inputs.vocabulary.index("[SEP]"), inputs.pair_type_id
    # after BertTokenizer's own, which it sets from its special tokens
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair=f"[CLS] $A [SEP] $B:{type_id} [SEP]:{type_id}",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )  # fmt: skip
    if inputs.added_token:
        tokenizer.add_tokens([inputs.added_token])
    if inputs.called_before:  # transformers leaves the call's truncation and padding set in the backend
        tokenizer(["a dog runs"], ["here"], truncation=True, max_length=3, padding="max_length")
    return tokenizer


def raw_data_of(inputs: Inputs) -> DatasetDict:
    premises = [*PREMISES[:2], "the café is not here", *PREMISES[3:]] if inputs.premise_changed else PREMISES
    texts = {"premise": premises, "hypothesis": HYPOTHESES}
    features = Features({**{c: Value("string") for c in inputs.columns}, "label": ClassLabel(names=inputs.label_names)})
    rows = {**{c: texts[c] for c in inputs.columns}, "label": [0, 1, 1, 0, 1, 0]}
    split = Dataset.from_dict(rows, features=features)
    return DatasetDict(train=split.select(range(4)), validation=split.select(range(4, 6)))


def key_and_tokenized(inputs: Inputs) -> tuple[Path, list]:
    """The cache entry a run with ``inputs`` reads, and what it must hold: each split's tokenizer outputs,
    labels and label feature."""
    tokenizer, raw = tokenizer_of(inputs), raw_data_of(inputs)
    encode = encoder(tokenizer, text_columns(raw), inputs.max_seq_length, inputs.pad)
    held = [(name, split.features["label"], dict(encode(split[:])), split["label"]) for name, split in raw.items()]
    return tokenized_cache_path(raw, tokenizer, inputs.max_seq_length, Path("cache"), inputs.pad), held


@st.composite
def two_runs(draw) -> tuple[Inputs, Inputs]:
    """A run's inputs and another's with one to three of them changed (none: the same run twice)."""
    first = Inputs(**{name: draw(st.sampled_from(values)) for name, values in VALUES.items()})
    changed = draw(st.sets(st.sampled_from(sorted(VALUES)), max_size=3))
    return first, dataclasses.replace(first, **{name: draw(st.sampled_from(VALUES[name])) for name in changed})


def differing(first: Inputs, second: Inputs) -> set[str]:
    return {name for name in VALUES if getattr(first, name) != getattr(second, name)}


@settings(max_examples=300, deadline=None, derandomize=True, database=None, print_blob=False)
@given(two_runs())
def test_inputs_that_change_the_token_ids_change_the_cache_key(runs):
    (first_key, first_held), (second_key, second_held) = map(key_and_tokenized, runs)
    changed = differing(*runs)
    if first_held != second_held:
        assert first_key != second_key, f"{sorted(changed)} changed the token ids but not the key"
    if changed <= set(NOT_THE_IDS):
        assert first_held == second_held and first_key == second_key, sorted(changed)


@pytest.mark.parametrize("name", [name for name in VALUES if name not in NOT_THE_IDS])
def test_each_input_the_property_draws_changes_the_token_ids(name):
    """The property above is not vacuous: each input changes what the cache holds (from the default run;
    padded where the padding changes, truncated where the truncation side does)."""
    base = Inputs(pad=name in ("padding_side", "pad_token"), max_seq_length=5 if name == "truncation_side" else 64)
    held = [key_and_tokenized(dataclasses.replace(base, **{name: value}))[1] for value in VALUES[name]]
    assert any(other != held[0] for other in held[1:])


def save_copy(tokenizer_dir: Path, target: Path, **config: object) -> Path:
    """A copy of a saved tokenizer with settings of its tokenizer_config.json changed."""
    shutil.copytree(tokenizer_dir, target)
    path = target / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return target


def test_the_same_tokenizer_from_two_directories_has_one_key(tmp_path):
    texts = [row[c] for row in synthetic.generate(200, seed=0) for c in ("premise", "hypothesis")]
    prepare_tiny_tokenizer(tmp_path / "a", texts)
    copy = save_copy(tmp_path / "a", tmp_path / "elsewhere" / "b")
    first, second = load_tokenizer(str(tmp_path / "a")), load_tokenizer(str(copy))
    raw = raw_data_of(Inputs())
    assert tokenizer_digest(first) == tokenizer_digest(second)
    assert tokenized_cache_path(raw, first, 64, tmp_path) == tokenized_cache_path(raw, second, 64, tmp_path)
    first.save_pretrained(tmp_path / "saved")  # written again by transformers: the same tokenizer
    assert tokenizer_digest(load_tokenizer(str(tmp_path / "saved"))) == tokenizer_digest(first)


def test_a_second_run_with_an_uncased_copy_of_the_tokenizer_tokenizes_with_its_own(tmp_path, monkeypatch):
    """Two tokenizers of one vocabulary, the second with do_lower_case, one cache: the second run must not
    read the first run's ids ([UNK] for each capitalised word, where the second gives the word's id)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = synthetic.generate(120, seed=3)
    prepare_tiny_tokenizer(tmp_path / "cased", [row[c] for row in rows for c in ("premise", "hypothesis")])
    save_copy(tmp_path / "cased", tmp_path / "uncased", do_lower_case=True)
    pd.DataFrame(rows).assign(premise=lambda f: f["premise"].str.title()).to_csv(tmp_path / "train.csv", index=False)
    tokenizers, tokenized, own = {}, {}, {}
    for name in ("cased", "uncased"):  # in this order: the cased run fills the cache first
        config = parse_run_config(["--engine", "single", "--train_file", str(tmp_path / "train.csv"),
                                   "--tokenizer_name", str(tmp_path / name), "--max_seq_length", "64",
                                   "--output_dir", str(tmp_path / f"run-{name}")])  # fmt: skip
        engine = SingleEngine(config)
        tokenizers[name], tokenized[name] = prepare_data(config, engine, tmp_path / "cache", RankZero(engine), None)
        raw = load_raw_datasets(config.data, config.training.seed, config.model.cache_dir)
        own[name] = encoder(tokenizers[name], text_columns(raw), 64, pad=False)(raw["train"][:])["input_ids"]
    unknown = tokenizers["cased"].unk_token_id
    assert sum(unknown in ids for ids in own["cased"]) == len(own["cased"])  # every title-cased premise
    assert not any(unknown in ids for ids in own["uncased"])
    for name in ("cased", "uncased"):
        assert tokenized[name]["train"]["input_ids"] == own[name], name
    assert tokenizer_digest(tokenizers["cased"]) != tokenizer_digest(tokenizers["uncased"])  # resume refused


def test_a_python_tokenizer_is_known_by_its_settings_not_its_vocabulary_files_path(tmp_path):
    """A tokenizer without a Rust backend (BERT's Python one): do_lower_case is in its settings alone."""
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    cased = [BertTokenizerLegacy(str(tmp_path / name / "vocab.txt"), do_lower_case=False) for name in ("a", "b")]
    uncased = BertTokenizerLegacy(str(tmp_path / "a" / "vocab.txt"), do_lower_case=True)
    assert cased[0].tokenize("The Lamp") != uncased.tokenize("The Lamp")
    assert tokenizer_digest(cased[0]) == tokenizer_digest(cased[1]) != tokenizer_digest(uncased)
    loaded = [BertTokenizerLegacy.from_pretrained(str(tmp_path / name), do_lower_case=False) for name in ("a", "b")]
    assert tokenizer_digest(loaded[0]) == tokenizer_digest(loaded[1])
