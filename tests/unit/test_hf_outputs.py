"""What transformers' users and tools read: results files, trainer_state.json's log_history, checkpoints
that from_pretrained loads, eval metrics (loss, accuracy, macro F1), --eval_strategy, their argument names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.jobs import SMALL_JOB, run, train_cmd

from horovod_train.config.parsing import parse_run_config
from horovod_train.tasks.scores import METRICS, custom_classification_scores, metric_module

JOB = [*SMALL_JOB, "--engine", "single", "--synthetic_num_examples", "600", "--logging_steps", "3"]


def train(cache_dir: Path, out: Path, *args: str):
    return run(train_cmd(*JOB, "--output_dir", str(out), *args), cache_dir)


def test_f1_module_gives_scikit_learns_documented_values():
    """The f1_score examples of scikit-learn's documentation (the hub's "f1" metric wraps it)."""
    f1 = metric_module("f1")

    def score(average):
        return f1.compute(predictions=[0, 2, 1, 0, 0, 1], references=[0, 1, 2, 0, 1, 2], average=average)["f1"]

    assert score("macro") == pytest.approx(0.26666, abs=1e-4) and score("micro") == pytest.approx(1 / 3)
    assert score("weighted") == pytest.approx(0.26666, abs=1e-4) and score(None).tolist() == pytest.approx([0.8, 0, 0])
    binary = f1.compute(predictions=[0, 1, 1, 0, 1], references=[0, 1, 0, 0, 1])["f1"]
    assert binary == pytest.approx(0.8)  # precision 2/3, recall 1


def test_the_shipped_modules_give_the_runs_numbers_and_refuse_what_the_hubs_refuse():
    """One implementation of each metric (issue 57): the `evaluate` modules' numbers are the run's (scores.METRICS,
    scikit-learn's), on classes one of which is never predicted; a multiclass input to the binary F1 is refused,
    as the hub's module (scikit-learn) refuses it."""
    rng = np.random.default_rng(5)
    references = rng.integers(0, 4, 200)
    predictions = np.where(rng.random(200) < 0.6, references, rng.integers(0, 3, 200))
    given = {"predictions": predictions.tolist(), "references": references.tolist()}
    accuracy, f1 = metric_module("accuracy"), metric_module("f1")
    assert accuracy.compute(**given)["accuracy"] == METRICS["accuracy"](predictions, references)
    assert accuracy.compute(**given, normalize=False)["accuracy"] == (predictions == references).sum()
    for average in ("micro", "macro"):
        assert f1.compute(**given, average=average)["f1"] == METRICS[f"f1_{average}"](predictions, references)
    assert custom_classification_scores(**given) == {
        "accuracy": METRICS["accuracy"](predictions, references),
        "f1": METRICS["f1_macro"](predictions, references),
    }
    with pytest.raises(ValueError, match="Target is multiclass but average='binary'"):
        f1.compute(**given)


HF_NAMES = [  # flag, value, where it lands in the run's configuration
    ("--adam_beta1", "0.85", "adam_beta1", 0.85),
    ("--adam_beta2", "0.98", "adam_beta2", 0.98),
    ("--eval_strategy", "steps", "eval_strategy", "steps"),
    ("--eval_steps", "7", "eval_steps", 7),
    ("--do_predict", "true", "do_predict", True),
    ("--do_train", "true", "do_train", True),
    ("--do_eval", "true", "do_eval", True),
    ("--lr_scheduler_type", "cosine", "lr_scheduler_type", "cosine"),
    ("--save_strategy", "no", "save_strategy", "no"),
    ("--save_total_limit", "None", "save_total_limit", None),
    ("--pad_to_max_length", "true", "pad_to_max_length", True),
    ("--overwrite_cache", "true", "overwrite_cache", True),
    ("--report_to", "none", "report_to", "none"),
    ("--run_name", "bert-mnli", "run_name", "bert-mnli"),
    ("--label_smoothing_factor", "0.1", "label_smoothing_factor", 0.1),
    ("--load_best_model_at_end", "true", "load_best_model_at_end", True),
    ("--metric_for_best_model", "accuracy", "metric_for_best_model", "eval_accuracy"),
    ("--greater_is_better", "false", "greater_is_better", False),
    ("--config_name", "bert-base-cased", "config_name", "bert-base-cased"),
    ("--task_name", "mnli", "task_name", "mnli"),
    ("--do_predict", "false", "do_predict", False),
    ("--test_file", "test.csv", "test_file", "test.csv"),
]


@pytest.mark.parametrize(("flag", "value", "name", "expected"), HF_NAMES, ids=[h[0] for h in HF_NAMES])
def test_transformers_argument_names_are_accepted(flag, value, name, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where --test_file test.csv exists: data files are checked as they are parsed
    (tmp_path / "test.csv").write_text("premise,hypothesis\nA dog runs.,An animal moves.\n")
    assert parse_run_config([flag, value]).to_dict()[name] == expected


def test_pad_to_max_length_pads_every_example_and_overwrite_cache_tokenizes_again(tmp_path):
    from horovod_train.config.run_config import DataArguments
    from horovod_train.data.splits import load_raw_datasets
    from horovod_train.data.tokenize import load_tokenized, tokenize_to_disk, tokenized_cache_path
    from horovod_train.models.model import load_tokenizer, prepare_tiny_tokenizer, tiny_tokenizer_dir

    raw = load_raw_datasets(DataArguments(synthetic_num_examples=200), seed=0)
    texts = list(raw["train"]["premise"]) + list(raw["train"]["hypothesis"])
    prepare_tiny_tokenizer(target := tiny_tokenizer_dir(tmp_path, texts), texts)
    tokenizer = load_tokenizer(str(target))
    padded = tokenized_cache_path(raw, tokenizer, 40, tmp_path, pad=True)
    assert padded != tokenized_cache_path(raw, tokenizer, 40, tmp_path)
    tokenize_to_disk(raw, tokenizer, 40, padded, pad=True)
    lengths = {len(ids) for split in load_tokenized(padded).values() for ids in split["input_ids"]}
    assert lengths == {40}
    (padded / "marker").write_text("from the first run")
    tokenize_to_disk(raw, tokenizer, 40, padded, pad=True)
    assert (padded / "marker").is_file()  # reused
    tokenize_to_disk(raw, tokenizer, 40, padded, pad=True, overwrite=True)
    assert not (padded / "marker").exists() and (padded / "train").is_dir()  # tokenized again, in place
