"""Each GLUE task trains on its files as GLUE distributes them, in the test process (engine single): run_glue's
metric keys, the label names (STS-B: one float output). tests/integration/test_glue_files.py trains MNLI under
horovodrun as well, tests/integration/test_task_shapes.py STS-B's float labels (--task_name stsb)."""

from __future__ import annotations

import json

import pytest
from support.glue_layouts import TASKS, write_glue_task
from support.jobs import SMALL_JOB

from horovod_train.cli.main import main
from horovod_train.data import glue

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("task", TASKS)
def test_each_task_trains_on_its_glue_files(task, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_glue_task(task, tmp_path / "train.tsv", 200, seed=1)
    write_glue_task(task, tmp_path / "dev.tsv", 40, seed=2)
    out = tmp_path / "out"
    files = ["--task_name", task, "--train_file", str(tmp_path / "train.tsv"),
             "--validation_file", str(tmp_path / "dev.tsv")]  # fmt: skip
    args = [*SMALL_JOB, *files, "--max_steps", "3", "--preprocessing_num_workers", "2", "--output_dir", str(out)]
    assert main(["train", "--engine", "single", *args]) == 0
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_samples"] == 40
    missing = {f"eval_{name}" for name in glue.task_metric_names(task)} - set(results)
    assert not missing, f"{task}: run_glue's keys {sorted(missing)} not in {sorted(results)}"
    config = json.loads((out / "config.json").read_text())
    if task == "stsb":  # one float output, as run_glue trains it
        assert config["problem_type"] == "regression" and len(config["id2label"]) == 1
    else:
        assert list(config["id2label"].values()) == list(glue.TASK_LABEL_NAMES[task])
