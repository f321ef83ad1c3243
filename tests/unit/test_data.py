"""Data: synthetic-nli, local files, validation of columns and labels, tokenizer and caching."""

from __future__ import annotations

import collections
import json
import random

import datasets
import pandas as pd
import pytest
from datasets import Dataset
from support.data_files import write_glue_mnli

from horovod_train.common.errors import UsageError
from horovod_train.config import domains
from horovod_train.config.run_config import DataArguments
from horovod_train.data import synthetic
from horovod_train.data.loaders import train_loader
from horovod_train.data.sources import read_file
from horovod_train.data.splits import load_raw_datasets
from horovod_train.data.tokenize import dataset_digest, tokenize_to_disk, tokenized_cache_path, tokenizer_digest
from horovod_train.models.model import load_tokenizer, prepare_tiny_tokenizer, tiny_tokenizer_dir


def test_synthetic_is_deterministic_with_the_multi_nli_schema():
    rows = synthetic.generate(300, seed=7)
    assert rows == synthetic.generate(300, seed=7)
    assert rows != synthetic.generate(300, seed=8)
    assert tuple(rows[0]) == synthetic.COLUMNS
    counts = collections.Counter(r["label"] for r in rows)
    assert set(counts) == {0, 1, 2} and min(counts.values()) > 70


def test_synthetic_label_follows_the_premise():
    for row in synthetic.generate(500, seed=1):
        premise, claimed = row["premise"].split(), row["hypothesis"].split()[3]
        moved, landmark = premise[3], premise[7]
        expected = 0 if claimed == moved else 2 if claimed == landmark else 1
        assert row["label"] == expected and claimed not in ("", None)


def test_hypothesis_alone_does_not_reveal_the_label():
    """The claimed object's distribution is the same under every label (so no hypothesis-only cue)."""
    rows = synthetic.generate(30000, seed=3)
    by_label = {label: collections.Counter() for label in range(3)}
    for row in rows:
        by_label[row["label"]][row["hypothesis"].split()[3]] += 1
    for counter in by_label.values():
        total = sum(counter.values())
        freqs = [counter[o] / total for o in synthetic.OBJECTS]
        assert max(freqs) - min(freqs) < 0.03, "claimed objects should be ~uniform under each label"


def test_split_is_90_10_with_seed_42():
    raw = load_raw_datasets(DataArguments(synthetic_num_examples=1000), seed=5)
    assert len(raw["train"]) == 900 and len(raw["validation"]) == 100
    assert raw["train"].column_names == ["premise", "hypothesis", "label"]
    again = load_raw_datasets(DataArguments(synthetic_num_examples=1000), seed=5)
    assert list(raw["validation"]["premise"]) == list(again["validation"]["premise"])


def _write(frame: pd.DataFrame, path) -> None:
    suffix = path.suffix
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".tsv":
        frame.to_csv(path, index=False, sep="\t")
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        path.write_text(json.dumps(frame.to_dict(orient="records")))


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".json", ".jsonl"])
def test_local_files_load_with_extra_columns_dropped(tmp_path, suffix):
    frame = pd.DataFrame(synthetic.generate(50, seed=0))
    train, validation = tmp_path / f"train{suffix}", tmp_path / f"dev{suffix}"
    _write(frame, train)
    _write(frame.head(10), validation)
    raw = load_raw_datasets(DataArguments(train_file=str(train), validation_file=str(validation)), seed=0)
    assert len(raw["train"]) == 50 and len(raw["validation"]) == 10
    assert raw["train"].column_names == ["premise", "hypothesis", "label"]
    assert raw["train"][0]["premise"] == frame.iloc[0]["premise"]


def test_max_predict_samples_cuts_the_test_split_as_run_glue(tmp_path):
    frame = pd.DataFrame(synthetic.generate(30, seed=0))
    _write(frame, tmp_path / "train.csv")
    _write(frame.head(12), tmp_path / "test.csv")
    args = DataArguments(train_file=str(tmp_path / "train.csv"), test_file=str(tmp_path / "test.csv"),
                         max_predict_samples=5)  # fmt: skip
    raw = load_raw_datasets(args, seed=0)
    assert raw["test"]["premise"] == list(frame["premise"][:5]) and len(raw["train"]) == 27


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (pd.DataFrame({"s1": ["a"], "s2": ["b"], "label": [0]}), "has no text column"),
        (pd.DataFrame({"premise": ["a"], "hypothesis": ["b"], "y": [0]}), "has no column 'label'"),
        (pd.DataFrame({"premise": ["a", "b"], "hypothesis": ["b", "c"], "label": [0, 3]}), "outside 0..1"),
        (pd.DataFrame({"premise": ["a", "b"], "hypothesis": ["b", "c"], "label": [0, -1]}), "outside 0..1"),
        (pd.DataFrame({"premise": [], "hypothesis": [], "label": []}), "no examples"),
        (pd.DataFrame({"premise": ["a", None], "hypothesis": ["b", "c"], "label": [0, 1]}), "empty or non-text"),
    ],
)
def test_bad_files_are_refused(tmp_path, frame, message):
    path = tmp_path / "train.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(UsageError, match=message):
        load_raw_datasets(DataArguments(train_file=str(path)), seed=0)


def test_missing_and_unsupported_files_are_refused(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_raw_datasets(DataArguments(train_file=str(tmp_path / "nope.csv")), seed=0)
    (tmp_path / "data.xlsx").write_text("x")
    with pytest.raises(UsageError, match="unsupported extension"):
        load_raw_datasets(DataArguments(train_file=str(tmp_path / "data.xlsx")), seed=0)


def test_the_reader_reads_the_suffixes_of_the_data_file_domain_alone(tmp_path, monkeypatch):
    """One list of data-file suffixes, domains.DATA_SUFFIXES: the reader refuses what the argument refuses, and a file
    that is gone since the arguments were checked is refused as the argument would be."""
    path = tmp_path / "train.parquet"
    pd.DataFrame({"text": ["a b", "c d"], "label": [0, 1]}).to_parquet(path)
    assert read_file(str(path), "--train_file", tmp_path / "cache")["text"] == ["a b", "c d"]
    monkeypatch.setattr(domains, "DATA_SUFFIXES", (".csv",))
    with pytest.raises(UsageError, match=r"--train_file .*train\.parquet has unsupported extension '\.parquet'"):
        read_file(str(path), "--train_file", tmp_path / "cache")
    gone = tmp_path / "gone.csv"
    gone.write_text("text,label\na b,0\nc d,1\n")
    args = DataArguments(train_file=str(gone))
    gone.unlink()
    with pytest.raises(UsageError, match="does not exist; fix: pass an existing file to --train_file$"):
        load_raw_datasets(args, seed=0)


def test_tiny_tokenizer_is_trained_once_and_reused(tmp_path):
    raw = load_raw_datasets(DataArguments(synthetic_num_examples=300), seed=0)
    texts = list(raw["train"]["premise"]) + list(raw["train"]["hypothesis"])
    target = tiny_tokenizer_dir(tmp_path, texts)
    prepare_tiny_tokenizer(target, texts)
    stamp = (target / "tokenizer.json").stat().st_mtime_ns
    prepare_tiny_tokenizer(target, texts)
    assert (target / "tokenizer.json").stat().st_mtime_ns == stamp
    tokenizer = load_tokenizer(str(target))
    tokens = tokenizer.tokenize(raw["train"][0]["premise"])
    assert "[UNK]" not in tokens and len(tokens) == len(raw["train"][0]["premise"].split())

    cached = tokenized_cache_path(raw, tokenizer, 64, tmp_path)
    tokenize_to_disk(raw, tokenizer, 64, cached)
    assert (cached / "train").is_dir() and (cached / "validation").is_dir()
    assert tokenized_cache_path(raw, tokenizer, 64, tmp_path) == cached
    assert tokenized_cache_path(raw, tokenizer, 32, tmp_path) != cached


def test_a_tsv_text_with_an_unbalanced_quote_stays_in_its_row(tmp_path):
    """TSV is not quoted: a '"' opening a text must not swallow the following lines into one field."""
    frame = pd.DataFrame(synthetic.generate(30, seed=0))
    frame.loc[3, "premise"] = '"' + frame.loc[3, "premise"]
    frame.loc[9, "hypothesis"] = 'she said "no'
    path = tmp_path / "train.tsv"
    lines = ["\t".join(frame.columns)] + ["\t".join(map(str, row)) for row in frame.itertuples(index=False)]
    path.write_text("\n".join(lines) + "\n")
    raw = load_raw_datasets(DataArguments(train_file=str(path), validation_file=str(path)), seed=0)
    assert len(raw["train"]) == len(lines) - 1 == 30
    assert raw["train"].to_list() == frame[["premise", "hypothesis", "label"]].to_dict(orient="records")


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_texts_that_look_like_missing_values_stay_text(tmp_path, suffix):
    frame = pd.DataFrame(synthetic.generate(10, seed=0))
    frame.loc[:4, "hypothesis"] = ["NA", "None", "null", "n/a", "nan"]
    path = tmp_path / f"train{suffix}"
    _write(frame, path)
    raw = load_raw_datasets(DataArguments(train_file=str(path), validation_file=str(path)), seed=0)
    assert raw["train"]["hypothesis"] == list(frame["hypothesis"])
    frame.loc[7, "hypothesis"] = ""
    _write(frame, path)
    with pytest.raises(UsageError, match="empty or non-text hypothesis"):
        load_raw_datasets(DataArguments(train_file=str(path)), seed=0)


def test_a_tsv_line_split_by_a_carriage_return_is_refused(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("premise\thypothesis\tlabel\na b\tc\rd\t0\ne f\tg h\t1\n", newline="")
    with pytest.raises(UsageError, match="2 lines"):
        load_raw_datasets(DataArguments(train_file=str(path)), seed=0)


def test_glue_mnli_files_load_as_premise_hypothesis_label(tmp_path):
    train_rows = write_glue_mnli(tmp_path / "train.tsv", 300, seed=1, annotators=1)
    dev_rows = write_glue_mnli(tmp_path / "dev_matched.tsv", 120, seed=2, annotators=5)
    args = DataArguments(train_file=str(tmp_path / "train.tsv"), validation_file=str(tmp_path / "dev_matched.tsv"))
    raw = load_raw_datasets(args, seed=0)
    for split, rows in (("train", train_rows), ("validation", dev_rows)):
        assert raw[split].column_names == ["premise", "hypothesis", "label"]
        assert raw[split].to_list() == [{c: r[c] for c in ("premise", "hypothesis", "label")} for r in rows]
    assert set(raw["train"]["label"]) == {0, 1, 2}


def step_of_each_example(n: int, lengths: list[int], per_device: int, accumulation: int, world: int,
                         resumed_at: int, steps: int) -> dict[int, int]:  # fmt: skip
    """Which of the ``steps`` optimizer steps after a resume at step ``resumed_at`` trains each example."""
    dataset = Dataset.from_dict({"input_ids": [[0] * length for length in lengths]})
    global_batch = per_device * accumulation * world
    step_of = {}
    for rank in range(world):
        loader = train_loader(dataset, None, per_device, world, rank, seed=11, group_by_length=True,
                              gradient_accumulation_steps=accumulation)  # fmt: skip
        loader.sampler.begin_epoch(1, resumed_at * global_batch)
        shard = list(loader.sampler)
        per_step = per_device * accumulation
        for step in range(steps):
            step_of.update({i: step for i in shard[step * per_step : (step + 1) * per_step]})
    return step_of


def test_grouped_resume_on_another_split_of_the_global_batch_trains_the_same_examples():
    """The issue's measurement: a --group_by_length checkpoint of 2 ranks x 16 x accumulation 2 resumed on
    4 x 16 x 1 trained 224 of the 1024 examples of the next 16 steps at other steps (the plain sampler: none)."""
    n = 1500
    lengths = [random.Random(i).randint(5, 128) for i in range(n)]
    two_ranks = step_of_each_example(n, lengths, 16, 2, 2, resumed_at=3, steps=16)
    four_ranks = step_of_each_example(n, lengths, 16, 1, 4, resumed_at=3, steps=16)
    assert len(two_ranks) == len(four_ranks) == 16 * 64
    differ = sum(four_ranks.get(i) != step for i, step in two_ranks.items())
    assert differ == 0, f"{differ} of 1024 examples trained at another step"


@pytest.mark.parametrize("grouped", [False, True])
def test_a_position_counted_past_the_shard_resumes_at_the_epochs_end(grouped):
    """Checkpoints at an epoch's last step used to count a full batch for a partial last one (1088 of 1080
    examples): they resume with nothing left of the epoch instead of failing with __len__() < 0."""
    dataset = Dataset.from_dict({"input_ids": [[0] * (i % 13 + 1) for i in range(1080)]})
    sampler = train_loader(dataset, None, 64, 1, 0, seed=42, group_by_length=grouped).sampler
    sampler.begin_epoch(0, 17 * 64)
    assert len(sampler) == 0 and list(sampler) == []
    sampler.begin_epoch(0, 16 * 64)
    assert len(sampler) == 56 == len(list(sampler))


def test_dataset_digest_follows_content_not_chunking():
    ids = [[101, *range(i % 9), 102] for i in range(500)]
    whole = Dataset.from_dict({"input_ids": ids, "labels": [i % 3 for i in range(500)]})
    chunked = datasets.concatenate_datasets([whole.select(range(0, 123)), whole.select(range(123, 500))])
    assert chunked.data.table.column("input_ids").num_chunks > 1 or chunked._indices is not None
    assert dataset_digest(whole) == dataset_digest(chunked) == dataset_digest(whole.flatten_indices())
    assert dataset_digest(whole) != dataset_digest(whole.select(range(499)))
    moved = [*ids[:-1], [101, 5, 102]]  # one token id changed
    assert dataset_digest(whole) != dataset_digest(Dataset.from_dict({"input_ids": moved, "labels": whole["labels"]}))
    shifted = [[101], [*range(8), 102], *ids[2:]]  # the same ids, split into rows otherwise
    assert dataset_digest(whole) != dataset_digest(Dataset.from_dict({"input_ids": shifted, "labels": whole["labels"]}))


def test_tiny_tokenizers_of_one_size_trained_on_other_texts_have_other_digests(tmp_path):
    tokenizers = []
    for seed in (42, 7):
        texts = [row[c] for row in synthetic.generate(600, seed=seed) for c in ("premise", "hypothesis")]
        prepare_tiny_tokenizer(tmp_path / str(seed), texts)
        tokenizers.append(load_tokenizer(str(tmp_path / str(seed))))
    assert len(tokenizers[0]) == len(tokenizers[1])  # what the vocabulary-size check compared
    assert tokenizers[0].get_vocab() != tokenizers[1].get_vocab()
    assert tokenizer_digest(tokenizers[0]) != tokenizer_digest(tokenizers[1])
    assert tokenizer_digest(tokenizers[0]) == tokenizer_digest(load_tokenizer(str(tmp_path / "42")))
