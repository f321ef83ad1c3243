"""MNLI trains under horovodrun on its files as GLUE distributes them (every task: in-process, in
tests/unit/test_glue_training.py); bad data files are refused by every rank in one line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from support.glue_layouts import write_glue_task
from support.jobs import SMALL_JOB, assert_ok, horovodrun, read_results, run, train_here

from horovod_train.data import glue


# Every task trains in-process in tests/unit/test_glue_training.py; under horovodrun, the reference job's task on its
# GLUE files. The regression one's float labels on two ranks under horovodrun (--task_name stsb) are
# test_task_shapes.py's regression case.
@pytest.mark.slow
def test_mnli_trains_with_horovodrun_on_its_glue_files(tmp_path, cache_dir):
    write_glue_task("mnli", tmp_path / "train.tsv", 200, seed=1)
    write_glue_task("mnli", tmp_path / "dev.tsv", 40, seed=2)
    out = tmp_path / "out"
    files = ["--task_name", "mnli", "--train_file", str(tmp_path / "train.tsv"),
             "--validation_file", str(tmp_path / "dev.tsv")]  # fmt: skip
    args = [*SMALL_JOB, *files, "--max_steps", "3", "--preprocessing_num_workers", "2", "--output_dir", str(out)]
    proc = run(horovodrun(2, *args), cache_dir, timeout=420)
    assert_ok(proc)
    results = read_results(out)
    assert results["eval_samples"] == 40
    missing = {f"eval_{name}" for name in glue.task_metric_names("mnli")} - set(results)
    assert not missing, f"run_glue's keys {sorted(missing)} not in {sorted(results)}"
    config = json.loads((out / "config.json").read_text())
    assert list(config["id2label"].values()) == list(glue.TASK_LABEL_NAMES["mnli"])


def _refused_in_one_line(proc) -> str:
    lines = [line for line in proc.stderr.strip().splitlines() if "error: " in line]
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-2000:]
    return lines[0]


def test_a_parquet_file_without_the_text_column_is_refused_and_nothing_written(tmp_path, cache_dir):
    data = tmp_path / "data"
    data.mkdir()
    pd.DataFrame({"premise": ["a b", "c d"] * 10, "label": [0, 1] * 10}).to_parquet(data / "train.parquet")
    out = tmp_path / "out"
    proc = train_here(
        cache_dir, "--engine", "single", "--train_file", str(data / "train.parquet"), "--output_dir", str(out)
    )
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "train data has no text column" in _refused_in_one_line(proc) and "; fix: " in lines[0]
    assert not out.exists() and sorted(p.name for p in data.iterdir()) == ["train.parquet"]


@pytest.mark.slow
def test_bad_data_is_refused_by_every_rank_without_waiting(tmp_path, cache_dir):
    """The local main rank reads first; its refusal must not leave the other rank waiting at the barrier
    (horovodrun itself exits 1 once a rank exits 2)."""
    pd.DataFrame({"premise": ["a b", "c d"] * 10, "label": [0, 1] * 10}).to_parquet(tmp_path / "train.parquet")
    out = tmp_path / "out"
    proc = run(horovodrun(2, *SMALL_JOB, "--train_file", str(tmp_path / "train.parquet"), "--output_dir", str(out)),
               cache_dir, timeout=300)  # fmt: skip
    assert proc.returncode != 0 and "error: train data has no text column" in proc.stdout + proc.stderr
    assert not out.exists()
