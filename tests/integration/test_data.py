"""Data: synthetic-nli, local files, validation of columns and labels, tokenizer and caching."""

from __future__ import annotations

import pandas as pd
import pytest
from support.data_files import write_glue_mnli
from support.jobs import SMALL_JOB, assert_ok, read_results, train_here

from horovod_train.data import synthetic


@pytest.mark.slow
def test_a_model_given_the_hypothesis_alone_stays_near_chance(tmp_path, cache_dir):
    """Train the demo model on the demo data with every premise blanked: it cannot beat chance,
    while the same job with premises reaches >= 0.80 (tests/integration/test_horovod_integration.py)."""
    frame = pd.DataFrame(synthetic.generate(8000, seed=42))
    frame["premise"] = "."
    data = tmp_path / "hypothesis_only.csv"
    frame.to_csv(data, index=False)
    out = tmp_path / "out"
    proc = train_here(cache_dir, "--engine", "single", "--config", "configs/demo.yaml", "--train_file", str(data),
                      "--num_train_epochs", "4", "--output_dir", str(out), "--disable_tqdm")  # fmt: skip
    assert_ok(proc)
    accuracy = read_results(out)["eval_accuracy"]
    assert accuracy < 0.42, f"hypothesis-only accuracy {accuracy:.3f} should stay near chance (0.33)"


def test_an_unknown_string_label_is_refused_in_one_line(tmp_path, cache_dir):
    train = tmp_path / "train.tsv"
    write_glue_mnli(train, 100, seed=1, annotators=1)
    lines = train.read_text().splitlines()
    lines[1::25] = [line.rsplit("\t", 1)[0] + "\t-" for line in lines[1::25]]
    train.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    proc = train_here(cache_dir, "--engine", "single", "--train_file", str(train), "--output_dir", str(out))
    stderr = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(stderr) == 1, proc.stderr[-2000:]
    assert "gold_label" in stderr[0] and "'-' (4)" in stderr[0] and "; fix: " in stderr[0], stderr[0]
    assert not out.exists()


@pytest.mark.slow
def test_training_runs_on_glue_mnli_files_as_they_are(tmp_path, cache_dir):
    write_glue_mnli(tmp_path / "train.tsv", 300, seed=1, annotators=1)
    write_glue_mnli(tmp_path / "dev_matched.tsv", 120, seed=2, annotators=5)
    out = tmp_path / "out"
    files = ["--train_file", str(tmp_path / "train.tsv"), "--validation_file", str(tmp_path / "dev_matched.tsv")]
    proc = train_here(cache_dir, "--engine", "single", *SMALL_JOB, *files, "--max_steps", "5", "--output_dir", str(out))
    assert_ok(proc)
    assert read_results(out)["eval_samples"] == 120
