"""Data the way Hugging Face users bring it: GLUE tasks (run_glue.py's columns and splits), save_to_disk
directories, configurable text and label columns (run_classification.py), inferred label names, test splits."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pandas as pd
import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import bad_input
from support.data_files import DEFECTS, bad_data
from support.data_sources import NEGATIVE, POSITIVE, sentiment_frame

from horovod_train.common.errors import UsageError
from horovod_train.config.parsing import parse_run_config
from horovod_train.config.run_config import DataArguments
from horovod_train.data import glue
from horovod_train.data.columns import text_columns
from horovod_train.data.labels import label_names
from horovod_train.data.splits import eval_split_names, load_raw_datasets
from horovod_train.data.splits import test_split_names as split_names_of_tests

CLASSIFICATION_TASKS = [task for task in glue.TASK_TO_KEYS if task not in glue.REGRESSION_TASKS]


def glue_split(task: str, n: int, seed: int, labelled: bool = True) -> Dataset:
    """A GLUE-shaped split: the task's text columns, a ClassLabel ``label`` (-1 in test splits) and ``idx``."""
    rng = random.Random(seed)
    names = glue.TASK_LABEL_NAMES[task]
    columns = glue.task_text_columns(task)
    rows = [
        {
            **{column: f"{column} {i} says {rng.choice(POSITIVE + NEGATIVE)} ." for column in columns},
            "label": rng.randrange(len(names)) if labelled else -1,
            "idx": i,
        }
        for i in range(n)
    ]
    features = Features({**{c: Value("string") for c in columns}, "label": ClassLabel(names=list(names)),
                         "idx": Value("int32")})  # fmt: skip
    return Dataset.from_list(rows, features=features)


def save_glue_task(task: str, target: Path) -> DatasetDict:
    evals = glue.TASK_EVAL_SPLITS.get(task, ("validation",))
    tests = [name.replace("validation", "test") for name in evals]
    splits = {"train": glue_split(task, 24, seed=1)}
    splits.update({name: glue_split(task, 8, seed=2 + i) for i, name in enumerate(evals)})
    splits.update({name: glue_split(task, 5, seed=9, labelled=False) for name in tests})
    saved = DatasetDict(splits)
    saved.save_to_disk(str(target))
    return saved


@pytest.mark.parametrize("task", CLASSIFICATION_TASKS)
def test_a_saved_glue_task_loads_with_its_columns_splits_and_label_names(task, tmp_path):
    saved = save_glue_task(task, tmp_path / task)
    raw = load_raw_datasets(DataArguments(dataset_name=str(tmp_path / task), task_name=task), seed=0)
    keys = glue.task_text_columns(task)
    assert text_columns(raw) == keys and raw["train"].column_names == [*keys, "label"]
    assert label_names(raw) == list(glue.TASK_LABEL_NAMES[task])
    expected_evals = ["validation_matched", "validation_mismatched"] if task == "mnli" else ["validation"]
    assert eval_split_names(raw) == expected_evals
    assert split_names_of_tests(raw) == (["test_matched", "test_mismatched"] if task == "mnli" else ["test"])
    assert list(raw["train"]["label"]) == list(saved["train"]["label"])
    assert list(raw["train"][keys[0]]) == list(saved["train"][keys[0]])
    for name in split_names_of_tests(raw):
        assert set(raw[name]["label"]) == {-1} and len(raw[name]) == 5
    for split in raw.values():
        assert isinstance(split.features["label"], ClassLabel) and split.features["label"].names == label_names(raw)


def test_mnli_validation_splits_of_a_saved_dict_are_both_evaluated(tmp_path):
    """Without --task_name too: a save_to_disk directory's own validation_* splits, the first one primary."""
    splits = {"train": glue_split("mnli", 30, seed=1)}
    splits |= {"validation_matched": glue_split("mnli", 7, seed=2), "validation_mismatched": glue_split("mnli", 9, 3)}
    DatasetDict(splits).save_to_disk(str(tmp_path / "mnli"))
    files = sorted((tmp_path / "mnli").rglob("*"))
    raw = load_raw_datasets(DataArguments(dataset_name=str(tmp_path / "mnli"), max_eval_samples=8), seed=0)
    assert sorted((tmp_path / "mnli").rglob("*")) == files, "loading must not write cache files into the directory"
    assert eval_split_names(raw) == ["validation_matched", "validation_mismatched"]
    assert len(raw["train"]) == 30 and len(raw["validation_matched"]) == 7 and len(raw["validation_mismatched"]) == 8
    assert text_columns(raw) == ["premise", "hypothesis"]
    assert label_names(raw) == ["entailment", "neutral", "contradiction"]
    one = load_raw_datasets(
        DataArguments(dataset_name=str(tmp_path / "mnli"), validation_split_name="validation_mismatched"), seed=0
    )
    assert eval_split_names(one) == ["validation"] and len(one["validation"]) == 9


def test_a_saved_single_dataset_is_the_train_split(tmp_path):
    glue_split("sst2", 40, seed=1).save_to_disk(str(tmp_path / "sst2"))
    files = sorted((tmp_path / "sst2").rglob("*"))
    raw = load_raw_datasets(DataArguments(dataset_name=str(tmp_path / "sst2")), seed=0)
    assert sorted((tmp_path / "sst2").rglob("*")) == files
    assert (len(raw["train"]), len(raw["validation"])) == (36, 4)
    assert text_columns(raw) == ["sentence"] and label_names(raw) == ["negative", "positive"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="not one written by save_to_disk"):
        load_raw_datasets(DataArguments(dataset_name=str(tmp_path / "empty")), seed=0)


def test_a_glue_tsv_with_string_labels_takes_the_tasks_columns_and_names(tmp_path):
    """GLUE's own RTE files: index, sentence1, sentence2 and string labels."""
    lines = ["index\tsentence1\tsentence2\tlabel"]
    lines += [f"{i}\ta {i} b\tc {i}\t{('entailment', 'not_entailment')[i % 3 == 0]}" for i in range(12)]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
    raw = load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.tsv"), task_name="rte"), seed=0)
    assert text_columns(raw) == ["sentence1", "sentence2"] and label_names(raw) == ["entailment", "not_entailment"]
    assert sorted(set(raw["train"]["label"]) | set(raw["validation"]["label"])) == [0, 1]
    with pytest.raises(UsageError, match="train data has no column 'question'"):
        load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.tsv"), task_name="qnli"), seed=0)


def test_string_labels_without_names_map_to_the_sorted_distinct_labels(tmp_path):
    frame = pd.DataFrame({"text": [f"review {i}" for i in range(9)], "stars": ["mid", "low", "high"] * 3})
    frame.to_json(tmp_path / "train.jsonl", orient="records", lines=True)
    frame.head(3).to_json(tmp_path / "dev.jsonl", orient="records", lines=True)
    args = DataArguments(
        train_file=str(tmp_path / "train.jsonl"), validation_file=str(tmp_path / "dev.jsonl"), label_column_name="stars"
    )
    raw = load_raw_datasets(args, seed=0)
    assert label_names(raw) == ["high", "low", "mid"] and text_columns(raw) == ["text"]
    assert list(raw["train"]["label"])[:3] == [2, 1, 0] and list(raw["validation"]["label"]) == [2, 1, 0]
    with pytest.raises(UsageError, match="--num_labels 4 but the train data has 3 labels"):
        load_raw_datasets(dataclasses.replace(args, num_labels=4), seed=0)

    frame.head(3).assign(stars=["mid", "superb", "low"]).to_json(tmp_path / "dev.jsonl", orient="records", lines=True)
    with pytest.raises(UsageError) as refused:
        load_raw_datasets(args, seed=0)
    message = str(refused.value)
    assert f"validation data ({tmp_path / 'dev.jsonl'}) column stars" in message
    assert "'superb' (1)" in message and "\n" not in message


def test_integer_labels_infer_their_count(tmp_path):
    frame = pd.DataFrame({"sentence1": ["a b", "c d"] * 4, "sentence2": ["e", "f"] * 4, "label": [0, 1, 2, 3] * 2})
    frame.to_csv(tmp_path / "train.csv", index=False)
    raw = load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.csv")), seed=0)
    assert label_names(raw) == ["LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3"]
    assert text_columns(raw) == ["sentence1", "sentence2"]
    raw = load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.csv"), num_labels=5), seed=0)
    assert len(label_names(raw)) == 5


def test_a_test_file_without_labels_is_a_test_split_labelled_minus_one(tmp_path):
    sentiment_frame(40, seed=0).to_csv(tmp_path / "train.csv", index=False)
    sentiment_frame(6, seed=1)[["sentence"]].to_csv(tmp_path / "test.csv", index=False)
    args = DataArguments(train_file=str(tmp_path / "train.csv"), test_file=str(tmp_path / "test.csv"))
    raw = load_raw_datasets(args, seed=0)
    assert split_names_of_tests(raw) == ["test"] and eval_split_names(raw) == ["validation"]
    assert list(raw["test"]["label"]) == [-1] * 6 and raw["test"].column_names == ["sentence", "label"]
    assert raw["test"].features["label"].names == ["negative", "positive"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--task_name", "glue"], "unknown --task_name"),
        (["--text_column_names", "a,b,c"], "one or two column names"),
        (["--text_column_names", "a,"], "one or two column names"),
        (["--num_labels", "0"], "--num_labels must be > 0"),
    ],
)
def test_bad_data_arguments_are_refused(argv, message):
    with pytest.raises(UsageError, match=message):
        parse_run_config(argv)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.data(), n=st.integers(4, 12), seed=st.integers(0, 99))
def test_bad_data_files_and_columns_are_refused_in_one_line_naming_the_cause(data, n, seed, tmp_path_factory):
    """Combinations of a defect (a column in two roles or missing from a split, a JSON file of one object or of
    values, a line short of or with a field too many, another encoding, one example), the file format, the split
    that has it and where in the file: each refused by the real reading code in one line, with its fix, naming
    the defect (tests/integration/test_bad_input.py runs a sample as real programs)."""
    defect = data.draw(st.sampled_from(sorted(DEFECTS)), label="defect")
    formats, splits = DEFECTS[defect]
    suffix = data.draw(st.sampled_from(formats), label="format")
    split = data.draw(st.sampled_from(splits), label="split")
    case = bad_data(defect, suffix, split, n, seed, line=data.draw(st.integers(0, n - 1), label="line"))
    directory = tmp_path_factory.mktemp("bad-data")
    flags = case.write(directory)
    before = bad_input.snapshot(directory)
    with pytest.raises(UsageError) as refused:
        load_raw_datasets(parse_run_config(flags).data, seed=0)
    line = str(refused.value)
    assert "\n" not in line and refused.value.fix and case.cause.replace("{dir}", str(directory)) in line, line
    assert "single label" not in line
    assert bad_input.snapshot(directory) == before
