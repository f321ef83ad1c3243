"""Issue 21's task shapes in-process: regression and multi-label data, models and collation, and run_glue's
metrics per task checked against scikit-learn and scipy on the same predictions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from datasets import ClassLabel, DatasetDict, List, Value
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef, mean_squared_error
from support.task_data import TOPICS, write_multi_label_jsonl, write_regression_csv

from horovod_train.common.errors import UsageError
from horovod_train.config.parsing import parse_run_config
from horovod_train.config.run_config import DataArguments
from horovod_train.data.labels import label_names, shape_of, task_line
from horovod_train.data.loaders import collator
from horovod_train.data.splits import load_raw_datasets
from horovod_train.models.model import (
    TINY_BERT,
    build_model,
    load_tokenizer,
    prepare_tiny_tokenizer,
    tiny_tokenizer_dir,
)
from horovod_train.tasks.base import TaskShape
from horovod_train.tasks.multi_label import MultiLabel
from horovod_train.tasks.regression import Regression
from horovod_train.tasks.single_label import SingleLabel
from horovod_train.training.build import check_task_shape
from horovod_train.training.metrics import exact_metrics

N = 101  # odd: the two "ranks" below hold shards of different sizes


def gathered(predictions: np.ndarray, references: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """(index, prediction(s), label(s)) rows as two ranks' strided shards gather them: rank 0's, then rank 1's."""
    index = np.arange(len(predictions)).reshape(-1, 1)
    rows = np.concatenate([index, predictions.reshape(len(index), -1), references.reshape(len(index), -1)], axis=1)
    return torch.tensor(np.concatenate([rows[0::2], rows[1::2]]), dtype=dtype)


def scored(shape: TaskShape, predictions: np.ndarray, references: np.ndarray) -> dict:
    dtype = torch.float64 if isinstance(shape, Regression) else torch.int64
    losses = torch.rand(len(predictions), dtype=torch.float64)
    return exact_metrics(gathered(predictions, references, dtype), losses, len(predictions), shape)


def classes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    references = rng.integers(0, n, N)
    predictions = np.where(rng.random(N) < 0.7, references, rng.integers(0, n, N))  # mostly right
    return predictions, references


@pytest.mark.parametrize("task", ["cola", "mrpc", "qqp", "sst2", "mnli", "qnli", "rte", "wnli", None])
def test_classification_metrics_are_run_glues_and_match_sklearn(task):
    rng = np.random.default_rng(7)
    predictions, references = classes(rng, 3 if task == "mnli" else 2)
    result = scored(SingleLabel(2, task), predictions, references)
    accuracy = accuracy_score(references, predictions)
    if task == "cola":
        expected = {"matthews_correlation": matthews_corrcoef(references, predictions)}
    elif task in ("mrpc", "qqp"):
        expected = {"accuracy": accuracy, "f1": f1_score(references, predictions)}  # the positive class's
    elif task is None:
        expected = {"accuracy": accuracy, "f1": f1_score(references, predictions, average="macro")}
    else:
        expected = {"accuracy": accuracy}
    if task in ("mrpc", "qqp"):
        expected["combined_score"] = (expected["accuracy"] + expected["f1"]) / 2
    assert set(result) == {"loss", "samples", *expected}
    assert result["samples"] == N
    for name, value in expected.items():
        assert result[name] == pytest.approx(value, abs=1e-12), name


@pytest.mark.parametrize("task", ["stsb", None])
def test_regression_metrics_match_scipy(task):
    rng = np.random.default_rng(3)
    references = rng.uniform(0, 5, N).astype(np.float32)
    predictions = (references + rng.normal(0, 1, N)).astype(np.float32)
    result = scored(Regression(1, task), predictions, references)
    p, r = predictions.astype(np.float64), references.astype(np.float64)
    expected = {"pearson": pearsonr(p, r)[0], "spearmanr": spearmanr(p, r)[0]}
    if task == "stsb":
        expected["combined_score"] = (expected["pearson"] + expected["spearmanr"]) / 2
    else:
        expected["mse"] = mean_squared_error(r, p)
    assert set(result) == {"loss", "samples", *expected}
    for name, value in expected.items():
        assert result[name] == pytest.approx(value, abs=1e-12), name


def test_multi_label_metrics_match_sklearn():
    rng = np.random.default_rng(5)
    references = (rng.random((N, 4)) < 0.4).astype(np.int64)
    predictions = np.where(rng.random((N, 4)) < 0.8, references, 1 - references)
    result = scored(MultiLabel(4), predictions, references)
    assert set(result) == {"loss", "samples", "accuracy", "f1_micro", "f1_macro"}
    assert result["accuracy"] == pytest.approx(accuracy_score(references, predictions))
    assert result["accuracy"] == pytest.approx(np.mean((predictions == references).all(axis=1)))  # subset accuracy
    assert result["f1_micro"] == pytest.approx(f1_score(references, predictions, average="micro"))
    assert result["f1_macro"] == pytest.approx(f1_score(references, predictions, average="macro"))


def test_a_regression_row_keeps_float32_values_exactly():
    """float64 rows: a float32 label (3.8 is not 3.8 in float32) and an index come back bit for bit."""
    labels = np.array([3.8, 0.1, 4.999, 2.2], dtype=np.float32)
    rows = gathered(labels[::-1].copy(), labels, torch.float64)
    ordered = rows[torch.argsort(rows[:, 0].long())]
    assert ordered[:, 2].numpy().astype(np.float32).tobytes() == labels.tobytes()


def regression_args(tmp_path, **extra) -> DataArguments:
    write_regression_csv(tmp_path / "train.csv", 60, seed=0)
    return DataArguments(train_file=str(tmp_path / "train.csv"), **extra)


@pytest.mark.parametrize("extra", [{}, {"task_name": "stsb"}, {"num_labels": 1}])
def test_stsb_float_labels_or_one_label_make_a_regression(tmp_path, extra):
    raw = load_raw_datasets(regression_args(tmp_path, **extra), seed=0)
    assert shape_of(raw) is Regression and label_names(raw) == ["LABEL_0"]
    assert raw["train"].features["label"] == Value("float32")
    expected = pd.read_csv(tmp_path / "train.csv")["label"].to_numpy(np.float32)
    assert sorted([*raw["train"]["label"], *raw["validation"]["label"]]) == sorted(expected.tolist())


def test_integer_labels_with_num_labels_1_are_regression_targets(tmp_path):
    frame = pd.DataFrame({"text": [f"text {i}" for i in range(20)], "label": [i % 5 for i in range(20)]})
    frame.to_csv(tmp_path / "train.csv", index=False)
    raw = load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.csv"), num_labels=1), seed=0)
    assert shape_of(raw) is Regression and set(raw["train"]["label"]) <= {0.0, 1.0, 2.0, 3.0, 4.0}


def test_lists_of_label_names_make_a_multi_label_dataset(tmp_path):
    labels = write_multi_label_jsonl(tmp_path / "train.jsonl", 60, seed=0)
    raw = load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.jsonl")), seed=0)
    assert shape_of(raw) is MultiLabel and label_names(raw) == sorted(TOPICS)
    assert raw["train"].features["label"] == List(ClassLabel(names=sorted(TOPICS)))
    names = sorted(TOPICS)
    encoded = [[names[i] for i in ids] for ids in [*raw["train"]["label"], *raw["validation"]["label"]]]
    assert sorted(map(sorted, encoded)) == sorted(map(sorted, labels))
    assert [] in encoded  # an example without any label is kept


def test_lists_of_integer_labels_take_num_labels(tmp_path):
    rows = [{"text": f"text {i}", "label": [i % 3] + ([3] if i % 2 else [])} for i in range(20)]
    (tmp_path / "train.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    raw = load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.jsonl"), num_labels=5), seed=0)
    assert shape_of(raw) is MultiLabel and label_names(raw) == [f"LABEL_{i}" for i in range(5)]


# ---- labels written as text (issue 34): the task is inferred from their values, or refused with the row ----
def texts_and(labels: list) -> list[dict]:
    return [{"text": f"example {i} moves the lamp", "label": label} for i, label in enumerate(labels)]


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_numbers_written_as_json_strings_make_a_regression(tmp_path):
    scores = write_regression_csv(tmp_path / "scores.csv", 60, seed=0)
    rows = texts_and([str(score) for score in scores])  # "3.8": 47 distinct strings, once 47 classes
    raw = load_raw_datasets(DataArguments(train_file=write_jsonl(tmp_path / "train.jsonl", rows)), seed=0)
    assert shape_of(raw) is Regression and label_names(raw) == ["LABEL_0"]
    assert raw["train"].features["label"] == Value("float32")
    loaded = sorted([*raw["train"]["label"], *raw["validation"]["label"]])
    assert loaded == sorted(np.array(scores, dtype=np.float32).tolist())
    assert task_line(raw) == "task: regression (one number per example)"


@pytest.mark.parametrize("odd", ["n/a", "NaN", "high", "-"])
def test_a_number_column_with_a_cell_that_is_not_a_number_is_refused_with_its_row(tmp_path, odd):
    """A CSV reads the whole column as text then: it trained a classifier of each distinct text."""
    write_regression_csv(tmp_path / "train.csv", 60, seed=0)
    frame = pd.read_csv(tmp_path / "train.csv").astype({"label": object})
    frame.loc[7, "label"] = odd
    frame.to_csv(tmp_path / "train.csv", index=False)
    with pytest.raises(UsageError) as refused:
        load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.csv")), seed=0)
    message = str(refused.value)
    assert f"train.csv) column label row 8 holds {odd!r} where its other rows hold numbers" in message, message
    assert "fix: use either numbers or label names" in message and "\n" not in message


def test_a_regression_test_file_may_leave_labels_empty_but_not_write_n_a(tmp_path):
    write_regression_csv(tmp_path / "train.csv", 60, seed=0)
    test = pd.DataFrame({"sentence1": ["a b", "c d", "e f"], "sentence2": ["x", "y", "z"], "label": [2.5, None, 1.0]})
    test.to_csv(tmp_path / "test.csv", index=False)
    args = DataArguments(train_file=str(tmp_path / "train.csv"), test_file=str(tmp_path / "test.csv"))
    labels = load_raw_datasets(args, seed=0)["test"]["label"]
    assert labels[0] == 2.5 and math.isnan(labels[1]) and labels[2] == 1.0
    test.astype({"label": object}).fillna("n/a").to_csv(tmp_path / "test.csv", index=False)
    with pytest.raises(UsageError, match=r"test data \(.*test\.csv\) column label row 2 holds 'n/a'"):
        load_raw_datasets(args, seed=0)


def test_a_csv_column_of_json_lists_is_multi_label_as_its_jsonl(tmp_path):
    write_multi_label_jsonl(tmp_path / "train.jsonl", 60, seed=0)
    frame = pd.read_json(tmp_path / "train.jsonl", lines=True)
    frame.assign(label=frame["label"].map(json.dumps)).to_csv(tmp_path / "train.csv", index=False)  # ["people"]
    from_csv = load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.csv")), seed=0)
    from_jsonl = load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.jsonl")), seed=0)
    assert shape_of(from_csv) is MultiLabel and label_names(from_csv) == sorted(TOPICS)
    for split in ("train", "validation"):
        assert from_csv[split].features["label"] == from_jsonl[split].features["label"]
        assert from_csv[split].to_list() == from_jsonl[split].to_list()
    assert task_line(from_csv) == "task: multi_label_classification over 3 labels (people, places, things)"


def test_csv_lists_of_integer_ids_take_num_labels(tmp_path):
    rows = [{"text": f"text {i}", "label": json.dumps([i % 3] + ([3] if i % 2 else []))} for i in range(20)]
    pd.DataFrame(rows).to_csv(tmp_path / "train.csv", index=False)
    raw = load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.csv"), num_labels=5), seed=0)
    assert shape_of(raw) is MultiLabel and label_names(raw) == [f"LABEL_{i}" for i in range(5)]
    ids = sorted(map(sorted, [*raw["train"]["label"], *raw["validation"]["label"]]))
    assert ids == sorted(sorted({i % 3} | ({3} if i % 2 else set())) for i in range(20))


@pytest.mark.parametrize(
    ("cells", "row", "expected"),
    [
        (
            ['["tech"]', '["art", "tech"]', "tech", "[]"] * 5,
            3,
            "holds 'tech' where its other rows hold lists of labels",
        ),
        (['["tech"]', '["art", 1]', '["art"]'] * 5, 2, "a list's labels must all be names or all integer ids"),
    ],
)
def test_a_csv_label_column_of_lists_and_other_cells_is_refused_with_its_row(tmp_path, cells, row, expected):
    pd.DataFrame({"text": [f"t {i}" for i in range(len(cells))], "label": cells}).to_csv(
        tmp_path / "t.csv", index=False
    )
    with pytest.raises(UsageError) as refused:
        load_raw_datasets(DataArguments(train_file=str(tmp_path / "t.csv")), seed=0)
    assert f"row {row} holds" in str(refused.value) and expected in str(refused.value), str(refused.value)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_multi_label_data_whose_lists_are_all_empty_is_refused(tmp_path, suffix):
    frame = pd.DataFrame(texts_and([[] for _ in range(20)]))
    path = tmp_path / f"train{suffix}"
    if suffix == ".csv":
        frame.assign(label="[]").to_csv(path, index=False)
    else:
        write_jsonl(path, frame.to_dict("records"))
    for extra in ({}, {"num_labels": 3}):
        with pytest.raises(UsageError) as refused:
            load_raw_datasets(DataArguments(train_file=str(path), **extra), seed=0)
        message = str(refused.value)
        assert "holds lists of labels, all empty: no example has a label; fix: give each example" in message


def test_the_task_line_names_a_classification_and_its_labels(tmp_path):
    rows = texts_and(["positive", "negative", "neutral"] * 7)
    raw = load_raw_datasets(DataArguments(train_file=write_jsonl(tmp_path / "train.jsonl", rows)), seed=0)
    assert task_line(raw) == "task: single_label_classification over 3 labels (negative, neutral, positive)"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = [f"example {i} moves the lamp" for i in range(50)]
    directory = tiny_tokenizer_dir(tmp_path_factory.mktemp("tok"), texts)
    prepare_tiny_tokenizer(directory, texts)
    return load_tokenizer(str(directory))


def test_collators_give_float32_regression_targets_and_multi_hot_rows(tokenizer):
    from datasets import Dataset

    ids = [tokenizer("the lamp")["input_ids"], tokenizer("example 3 moves")["input_ids"]]
    multi = Dataset.from_dict({"input_ids": ids, "labels": [[0, 2], []]},
                              features=None).cast_column("labels", List(ClassLabel(names=["a", "b", "c"])))  # fmt: skip
    regression = Dataset.from_dict({"input_ids": ids, "labels": [3.8, 0.25]}).cast_column("labels", Value("float32"))
    hot = collator(multi, tokenizer)([multi[0], multi[1]])
    assert hot["labels"].dtype == torch.float32 and hot["labels"].tolist() == [[1, 0, 1], [0, 0, 0]]
    assert hot["input_ids"].shape == (2, max(map(len, ids)))
    floats = collator(regression, tokenizer)([regression[0], regression[1]])["labels"]
    assert floats.dtype == torch.float32 and floats.tolist() == [np.float32(3.8), 0.25]


@pytest.mark.parametrize(
    ("kind", "num_labels", "problem_type"),
    [(Regression, 1, "regression"), (MultiLabel, 3, "multi_label_classification")],
)
def test_the_model_config_carries_the_problem_type_and_its_loss(tokenizer, kind, num_labels, problem_type):
    """The model's own loss is MSE on one output for a regression, BCE-with-logits for multi-label."""
    names = ["LABEL_0"] if kind is Regression else ["x", "y", "z"]
    model = build_model(TINY_BERT, num_labels, names, len(tokenizer), seed=0, shape=kind)
    assert model.config.problem_type == problem_type and model.config.id2label == dict(enumerate(names))
    batch = tokenizer(["the lamp", "example 3 moves"], padding=True, return_tensors="pt")
    labels = torch.tensor([3.8, 0.5]) if kind is Regression else torch.tensor([[1.0, 0, 1], [0, 0, 0]])
    out = model(**batch, labels=labels)
    if kind is Regression:
        expected = torch.nn.functional.mse_loss(out.logits.squeeze(-1), labels)
    else:
        expected = torch.nn.functional.binary_cross_entropy_with_logits(out.logits, labels)
    assert torch.allclose(out.loss, expected)


def test_bad_regression_label_is_refused_with_its_row(tmp_path):
    frame = pd.DataFrame({"sentence1": ["a b", "c d", "e f"], "sentence2": ["x", "y", "z"],
                          "label": ["3.5", "high", "1"]})  # fmt: skip
    frame.to_csv(tmp_path / "train.csv", index=False)
    with pytest.raises(UsageError, match=r"row 2 holds 'high', which is not a number"):
        load_raw_datasets(DataArguments(train_file=str(tmp_path / "train.csv"), task_name="stsb"), seed=0)


def test_a_multi_label_cell_that_is_not_a_list_is_refused(tmp_path):
    write_multi_label_jsonl(tmp_path / "train.jsonl", 30, seed=0)
    rows = [{"text": "a b", "label": ["people"]}, {"text": "c d", "label": "places"}]
    (tmp_path / "dev.jsonl").write_text("\n".join(map(json.dumps, rows[1:])) + "\n")
    args = DataArguments(train_file=str(tmp_path / "train.jsonl"), validation_file=str(tmp_path / "dev.jsonl"))
    with pytest.raises(UsageError, match=r"row 1 holds 'places', which is not a list of labels"):
        load_raw_datasets(args, seed=0)


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.1"])
def test_a_threshold_outside_0_1_is_refused(value):
    with pytest.raises(UsageError, match=r"--multi_label_threshold must be in \(0, 1\)"):
        parse_run_config(["--multi_label_threshold", value])


def fake_tokenized(kind: type[TaskShape]) -> DatasetDict:
    from datasets import Dataset

    feature = {Regression: Value("float32"), MultiLabel: List(ClassLabel(names=["a", "b"]))}.get(
        kind, ClassLabel(names=["a", "b"]))  # fmt: skip
    value = {Regression: 1.5, MultiLabel: [1]}.get(kind, 1)
    split = Dataset.from_dict({"input_ids": [[1, 2]], "labels": [value]}).cast_column("labels", feature)
    return DatasetDict(train=split, validation=split)


@pytest.mark.parametrize(
    ("kind", "task", "names"),
    [
        (Regression, "stsb", ["pearson", "spearmanr", "combined_score"]),
        (Regression, None, ["mse", "pearson", "spearmanr"]),
        (MultiLabel, None, ["accuracy", "f1_micro", "f1_macro"]),
        (SingleLabel, "cola", ["matthews_correlation"]),
        (SingleLabel, "mrpc", ["accuracy", "f1", "combined_score"]),
    ],
)
def test_metric_for_best_model_accepts_every_metric_of_the_run(kind, task, names):
    tokenized = fake_tokenized(kind)
    for name in ["loss", *names]:
        args = parse_run_config(["--metric_for_best_model", name]).training
        check_task_shape(args, tokenized, task)
    args = parse_run_config(["--metric_for_best_model", "f1" if kind is Regression else "pearson"]).training
    with pytest.raises(UsageError, match="is not a metric of this run"):
        check_task_shape(args, tokenized, task)


def test_mse_is_lower_is_better_by_default():
    assert parse_run_config(["--metric_for_best_model", "mse"]).training.greater_is_better is False
    assert parse_run_config(["--metric_for_best_model", "pearson"]).training.greater_is_better is True


@pytest.mark.parametrize("kind", [Regression, MultiLabel])
def test_label_smoothing_is_refused_outside_single_label_classification(kind):
    args = parse_run_config(["--label_smoothing_factor", "0.1"]).training
    with pytest.raises(UsageError, match="--label_smoothing_factor smooths class labels"):
        check_task_shape(args, fake_tokenized(kind), None)


def test_predictions_are_written_as_run_glue_and_run_classification_write_them():
    names = {0: "people", 1: "places", 2: "things"}
    assert SingleLabel.shown(1, names) == "places"
    assert Regression.shown(3.14159, {0: "LABEL_0"}) == "3.142"
    assert MultiLabel.shown([0, 2], names) == "['people', 'things']"
    assert MultiLabel.shown([], names) == "[]"
    assert math.isnan(float(Regression.shown(float("nan"), {})))


class Fixed(torch.nn.Module):
    """Logits given per example (its first input id indexes them)."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.table = logits

    def forward(self, input_ids: torch.Tensor, **_: torch.Tensor):
        return type("Output", (), {"logits": self.table[input_ids[:, 0]]})()


def run_gather(logits: torch.Tensor, labels: list, shape: TaskShape) -> tuple[torch.Tensor, torch.Tensor]:
    from horovod_train.engines.single import SingleEngine
    from horovod_train.training.amp import Precision
    from horovod_train.training.evaluation import gather_outputs

    engine = SingleEngine.__new__(SingleEngine)
    batches = [{"input_ids": torch.tensor([[i], [i + 1]]), "example_index": torch.tensor([i, i + 1]),
                "labels": torch.tensor(labels[i : i + 2])} for i in range(0, len(labels), 2)]  # fmt: skip
    return gather_outputs(engine, Fixed(logits), batches, Precision("fp32", engine.device), True, shape=shape)


def test_regression_outputs_are_gathered_as_float64_with_squared_errors():
    logits = torch.tensor([[1.25], [3.8], [-0.5], [2.0]])
    labels = [1.0, 3.8, 0.5, 2.0]
    rows, losses = run_gather(logits, labels, Regression(1))
    assert rows.dtype == torch.float64
    assert rows[:, 1].tolist() == logits[:, 0].double().tolist()  # float32 predictions, exactly
    assert rows[:, 2].tolist() == torch.tensor(labels).double().tolist()
    assert losses.tolist() == pytest.approx([0.0625, 0.0, 1.0, 0.0])


def test_multi_label_outputs_are_thresholded_probabilities():
    logits = torch.tensor([[2.0, -2.0, 0.1], [-0.1, 0.0, 3.0]])  # sigmoid: .88 .12 .52 / .48 .5 .95
    labels = [[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]
    rows, losses = run_gather(logits, labels, MultiLabel(3, threshold=0.5))
    assert rows.tolist() == [[0, 1, 0, 1, 1, 0, 0], [1, 0, 0, 1, 0, 1, 1]]
    rows, _ = run_gather(logits, labels, MultiLabel(3, threshold=0.9))
    assert rows[:, 1:4].tolist() == [[0, 0, 0], [0, 0, 1]]
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor(labels), reduction="none")
    assert torch.allclose(losses, bce.mean(-1).double())
