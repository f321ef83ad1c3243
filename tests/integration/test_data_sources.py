"""Data the way Hugging Face users bring it: GLUE tasks (run_glue.py's columns and splits), save_to_disk
directories, configurable text and label columns (run_classification.py), inferred label names, test splits."""

from __future__ import annotations

import json

from support.data_sources import sentiment_frame
from support.jobs import SMALL_JOB, assert_ok, read_results, train_here


def test_a_single_sentence_task_trains_end_to_end(tmp_path, cache_dir):
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    sentiment_frame(600, seed=0).to_csv(train, index=False)
    sentiment_frame(20, seed=1)[["idx", "sentence"]].to_csv(test, index=False)
    out = tmp_path / "out"
    files = ["--train_file", str(train), "--test_file", str(test)]
    proc = train_here(
        cache_dir, "--engine", "single", *SMALL_JOB, *files, "--max_steps", "20", "--output_dir", str(out)
    )
    assert_ok(proc)
    results = read_results(out)
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and results["eval_samples"] == 60
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["label2id"] == {"negative": 0, "positive": 1}


def test_bad_text_column_names_are_refused_in_one_line(tmp_path, cache_dir):
    sentiment_frame(40, seed=0).to_csv(tmp_path / "train.csv", index=False)
    out = tmp_path / "out"
    proc = train_here(cache_dir, "--engine", "single", "--train_file", str(tmp_path / "train.csv"),
                      "--text_column_names", "sentence,sentence2", "--output_dir", str(out))  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "train data has no column 'sentence2' (has: idx, sentence, label)" in lines[0] and "; fix: " in lines[0]
    assert not out.exists()
