"""GLUE's distributed .tsv files read as they are, task by task; data files through datasets' builders."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from datasets import DatasetDict
from support.glue_layouts import TASKS, write_glue_task

from horovod_train.common.errors import UsageError
from horovod_train.config.run_config import DataArguments
from horovod_train.data import glue, glue_files, synthetic
from horovod_train.data.columns import AUTO_TEXT_COLUMNS, from_glue_columns, text_columns
from horovod_train.data.sources import read_file
from horovod_train.data.splits import load_raw_datasets
from horovod_train.data.tokenize import dataset_digest, load_tokenized, tokenize_to_disk
from horovod_train.models.model import load_tokenizer, prepare_tiny_tokenizer, tiny_tokenizer_dir

CLASSIFICATION = [task for task in TASKS if task in glue.TASK_LABEL_NAMES]


@pytest.mark.parametrize("task", CLASSIFICATION)
def test_each_tasks_glue_files_load_with_run_glues_columns_and_label_names(task, tmp_path):
    train_rows = write_glue_task(task, tmp_path / "train.tsv", 60, seed=1, bom=task == "mrpc")
    dev_rows = write_glue_task(task, tmp_path / "dev.tsv", 20, seed=2)
    args = DataArguments(task_name=task, train_file=str(tmp_path / "train.tsv"),
                         validation_file=str(tmp_path / "dev.tsv"))  # fmt: skip
    raw = load_raw_datasets(args, seed=0)
    columns = [*glue.task_text_columns(task), "label"]
    for split, rows in (("train", train_rows), ("validation", dev_rows)):
        assert raw[split].column_names == columns
        assert raw[split].to_list() == rows
        assert raw[split].features["label"].names == list(glue.TASK_LABEL_NAMES[task])


def test_stsb_glue_files_read_as_sentence_pairs_and_float_scores(tmp_path):
    """STS-B trains where regression does (--task_name stsb is refused by the classifier): its columns read."""
    rows = write_glue_task("stsb", tmp_path / "train.tsv", 40, seed=3)
    dataset = read_file(str(tmp_path / "train.tsv"), "--train_file", tmp_path / "cache", "stsb")
    args = SimpleNamespace(text_column_names=None, label_column_name="label", task_name="stsb")
    dataset, label, source = from_glue_columns(dataset, args)
    assert (label, source) == ("label", "score")
    assert dataset.column_names == ["sentence1", "sentence2", "label"]
    assert dataset.features["label"].dtype == "float64"
    assert dataset.to_list() == rows


def test_a_cola_test_file_with_its_header_reads_its_sentences(tmp_path):
    path = tmp_path / "test.tsv"
    path.write_text("index\tsentence\n0\tBill whistled past the house.\n1\tThe car honked down the road.\n")
    dataset = read_file(str(path), "--test_file", tmp_path / "cache", "cola")
    assert dataset.to_list() == [{"index": 0, "sentence": "Bill whistled past the house."},
                                 {"index": 1, "sentence": "The car honked down the road."}]  # fmt: skip


def test_a_parquet_file_trains_like_its_csv(tmp_path):
    frame = pd.DataFrame(synthetic.generate(50, seed=0))
    frame.to_parquet(tmp_path / "train.parquet")
    frame.to_csv(tmp_path / "train.csv", index=False)
    from_parquet = load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.parquet")), seed=0)
    from_csv = load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.csv")), seed=0)
    assert from_parquet["train"].to_list() == from_csv["train"].to_list()
    assert len(from_parquet["train"]) == 45


def test_a_parquet_file_without_the_text_column_is_refused(tmp_path):
    pd.DataFrame({"premise": ["a b", "c d"], "label": [0, 1]}).to_parquet(tmp_path / "train.parquet")
    with pytest.raises(UsageError, match="has no text column"):
        load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.parquet")), seed=0)
    (tmp_path / "broken.parquet").write_text("premise,label\n")
    with pytest.raises(UsageError, match="broken.parquet cannot be parsed"):
        load_raw_datasets(DataArguments(train_file=str(tmp_path / "broken.parquet")), seed=0)


def test_a_file_is_read_into_the_arrow_cache_once(tmp_path):
    path = tmp_path / "train.csv"
    pd.DataFrame(synthetic.generate(30, seed=0)).to_csv(path, index=False)
    first = read_file(str(path), "--train_file", tmp_path / "cache")
    again = read_file(str(path), "--train_file", tmp_path / "cache")
    built = sorted((tmp_path / "cache" / "files").rglob("*.arrow"))
    assert len(built) == 1 and [f["filename"] for f in first.cache_files] == [str(built[0])]
    assert again.cache_files == first.cache_files


def _tokenized(raw: DatasetDict, tmp_path, num_proc: int) -> DatasetDict:
    texts = list(raw["train"]["premise"]) + list(raw["train"]["hypothesis"])
    directory = tiny_tokenizer_dir(tmp_path, texts)
    prepare_tiny_tokenizer(directory, texts)
    tokenizer = load_tokenizer(str(directory))
    target = tmp_path / f"tokenized-{num_proc}"
    tokenize_to_disk(raw, tokenizer, 32, target, num_proc=num_proc)
    return load_tokenized(target)


def test_parallel_tokenizing_writes_the_same_data_as_one_process(tmp_path):
    raw = load_raw_datasets(DataArguments(synthetic_num_examples=3001), seed=0)
    one, three = _tokenized(raw, tmp_path, 1), _tokenized(raw, tmp_path, 3)
    for split in raw:
        assert one[split].features == three[split].features
        assert one[split].data.table.equals(three[split].data.table)
        assert dataset_digest(one[split]) == dataset_digest(three[split])
    for name in ("train", "validation"):
        files = [sorted((tmp_path / f"tokenized-{n}" / name).glob("*.arrow")) for n in (1, 3)]
        assert [f.read_bytes() for f in files[0]] == [f.read_bytes() for f in files[1]]


# ---- test files without labels (issue 34): any layout the train file is read in ----------------------------
def without_labels(train: Path, test: Path, label: str) -> None:
    """``train`` (a file with a header) without its label columns (MNLI's label1..5 too), as ``test``."""
    rows = [line.split("\t") for line in train.read_text(encoding="utf-8").splitlines()]
    keep = [i for i, name in enumerate(rows[0]) if name.removeprefix(glue_files.BOM) != label
            and not re.fullmatch(r"label\d", name)]  # fmt: skip
    test.write_text("".join("\t".join(row[i] for i in keep) + "\n" for row in rows), encoding="utf-8")


def check_test_split(raw: DatasetDict, expected: list[dict]) -> None:
    columns = text_columns(raw)
    assert raw["test"].column_names == [*columns, "label"]
    assert [{c: row[c] for c in columns} for row in raw["test"]] == [{c: row[c] for c in columns} for row in expected]
    assert all(label == -1 or math.isnan(label) for label in raw["test"]["label"])


@pytest.mark.parametrize("columns", AUTO_TEXT_COLUMNS)
def test_a_labelless_test_file_in_the_train_files_columns_loads(tmp_path, columns):
    """sentence1/sentence2 was refused: the test file alone looked like MNLI's layout and became premise/hypothesis."""
    rows = [{"premise": r["premise"], "hypothesis": r["hypothesis"], "label": r["label"]}
            for r in synthetic.generate(40, seed=0)]  # fmt: skip
    texts = [{c: row[("premise", "hypothesis")[i]] for i, c in enumerate(columns)} for row in rows]
    pd.DataFrame([{**t, "label": row["label"]} for t, row in zip(texts, rows, strict=True)]).to_csv(
        tmp_path / "train.csv", index=False)  # fmt: skip
    pd.DataFrame(texts[:7]).to_csv(tmp_path / "test.csv", index=False)
    args = DataArguments(train_file=str(tmp_path / "train.csv"), test_file=str(tmp_path / "test.csv"))
    raw = load_raw_datasets(args, seed=0)
    assert text_columns(raw) == list(columns)
    check_test_split(raw, texts[:7])


@pytest.mark.parametrize("task", [task for task in TASKS if task != "cola"])  # CoLA's test.tsv: its own test above
def test_a_glue_test_file_without_labels_loads_beside_its_train_file(tmp_path, task):
    train_rows = write_glue_task(task, tmp_path / "train.tsv", 30, seed=1)
    label = next((s for s, t in glue_files.LAYOUTS.get(task, {}).items() if t == "label"), "label")
    without_labels(tmp_path / "train.tsv", tmp_path / "test.tsv", label)
    args = DataArguments(task_name=task, train_file=str(tmp_path / "train.tsv"), test_file=str(tmp_path / "test.tsv"))
    check_test_split(load_raw_datasets(args, seed=0), train_rows)


@pytest.mark.parametrize(("suffix", "header"), [(".csv", "premise,hypothesis\n"), (".tsv", "premise\thypothesis\n"),
                                                (".json", "[]\n"), (".jsonl", "")])  # fmt: skip
def test_a_test_file_of_a_header_alone_is_one_line_naming_it(tmp_path, suffix, header):
    """It ended in an IndexError."""
    pd.DataFrame(synthetic.generate(30, seed=0)).to_csv(tmp_path / "train.csv", index=False)
    test = tmp_path / f"test{suffix}"
    test.write_text(header)
    args = DataArguments(train_file=str(tmp_path / "train.csv"), test_file=str(test))
    with pytest.raises(UsageError) as refused:
        load_raw_datasets(args, seed=0)
    assert str(refused.value) == f"--test_file {test} has no examples; fix: add examples to it, or drop --test_file"
