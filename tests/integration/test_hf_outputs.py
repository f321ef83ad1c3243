"""What transformers' users and tools read: results files, trainer_state.json's log_history, checkpoints
that from_pretrained loads, eval metrics (loss, accuracy, macro F1), --eval_strategy, their argument names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.jobs import SMALL_JOB, assert_ok, run, train_cmd, train_here
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForSequenceClassification, AutoTokenizer

JOB = [*SMALL_JOB, "--engine", "single", "--synthetic_num_examples", "600", "--logging_steps", "3"]


def train(cache_dir: Path, out: Path, *args: str):
    """One process: run in this one (what is read is the run's files and lines, not a launch's)."""
    return train_here(cache_dir, *JOB, "--output_dir", str(out), *args)


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_run_writes_what_transformers_tools_read(tmp_path, cache_dir):
    out = tmp_path / "run"
    steps = ["--max_steps", "12", "--save_steps", "6", "--eval_strategy", "steps", "--eval_steps", "6"]
    proc = train(cache_dir, out, *steps, "--report_to", "tensorboard", "--run_name", "tb")
    assert_ok(proc)
    everything = read(out / "all_results.json")
    train_results, eval_results = read(out / "train_results.json"), read(out / "eval_results.json")
    assert set(train_results) == {"epoch", "train_loss", "train_runtime", "train_samples", "train_samples_per_second",
                                  "train_steps_per_second"}  # fmt: skip
    assert {"eval_loss", "eval_accuracy", "eval_f1", "eval_samples", "eval_runtime"} <= set(eval_results)
    assert all(k == "epoch" or k.startswith("eval_") for k in eval_results), eval_results
    assert {**train_results, **eval_results}.items() <= everything.items()
    assert everything["global_step"] == 12 and everything["eval_samples"] == 60 and everything["eval_loss"] > 0

    history = read(out / "trainer_state.json")["log_history"]
    logged = [e["step"] for e in history if "loss" in e]
    evaluated = [e["step"] for e in history if "eval_accuracy" in e]
    assert logged == [3, 6, 9, 12] and evaluated == [6, 12], history  # every 6 steps (the last is the final one)
    assert history[-1]["train_loss"] == pytest.approx(sum(e["loss"] for e in history if "loss" in e) / 4)
    assert history[-2]["eval_accuracy"] == everything["eval_accuracy"]

    # A checkpoint loads with from_pretrained as it is; the last one holds the final weights.
    final = AutoModelForSequenceClassification.from_pretrained(out).eval()
    for step in (6, 12):
        checkpoint = out / f"checkpoint-{step}"
        model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        batch = tokenizer("a man reads a book .", "a person reads .", return_tensors="pt")
        with torch.no_grad():
            same = torch.allclose(model(**batch).logits, final(**batch).logits, rtol=0, atol=1e-5)  # same weights
        assert same == (step == 12), step
        assert model.config.id2label == final.config.id2label
        assert [e["step"] for e in read(checkpoint / "trainer_state.json")["log_history"] if "loss" in e][-1] == step
    # TensorBoard events from rank 0, as HF's callback names them; the curves plot.
    events = EventAccumulator(str(out / "runs" / "tb")).Reload()
    loss = [(e.step, round(e.value, 5)) for e in events.Scalars("train/loss")]
    assert loss == [(e["step"], round(e["loss"], 5)) for e in history if "loss" in e]
    assert [e.step for e in events.Scalars("eval/accuracy")] == [6, 12]
    assert {"train/learning_rate", "train/samples_per_second", "eval/loss", "eval/f1"} <= set(events.Tags()["scalars"])
    assert (out / "training_curves.png").read_bytes().startswith(b"\x89PNG")
    assert "\r" not in proc.stdout + proc.stderr and "step 12/12 epoch " in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("validation accuracy "), proc.stdout[-500:]


def test_eval_strategy_no_evaluates_once_at_the_end(tmp_path, cache_dir):
    out = tmp_path / "run"
    assert_ok(train(cache_dir, out, "--num_train_epochs", "2", "--eval_strategy", "no"))
    history = read(out / "trainer_state.json")["log_history"]
    assert [e["step"] for e in history if "eval_loss" in e] == [read(out / "all_results.json")["global_step"]]


def test_hf_argument_parser_habits_no_flags_and_a_lone_json_file(tmp_path, cache_dir):
    """`--no_<flag>` for a flag that defaults to true, and `train args.json` as `python run_glue.py args.json`."""
    from horovod_train.cli.main import build_parser

    args = build_parser().parse_args(["train", "--no_do_eval"])
    assert args.do_eval is False and build_parser().parse_args(["train"]).do_eval is None  # None: the default
    refused = train_here(cache_dir, "--no_do_eval", "--output_dir", str(tmp_path / "x"))
    assert refused.returncode == 2 and "--do_eval false" in refused.stderr, refused.stderr

    out = tmp_path / "from-json"
    config = {"engine": "single", "model_name_or_path": "tiny-bert", "synthetic_num_examples": 300, "max_steps": 2,
              "per_device_train_batch_size": 16, "learning_rate": 3e-4, "output_dir": str(out)}  # fmt: skip
    (tmp_path / "args.json").write_text(json.dumps(config))
    assert_ok(train_here(cache_dir, str(tmp_path / "args.json")))
    assert read(out / "run_config.json")["learning_rate"] == 3e-4 and read(out / "all_results.json")["global_step"] == 2


def test_adam_betas_reach_the_optimizer(tmp_path, cache_dir):
    out = tmp_path / "run"
    betas = ["--adam_beta1", "0.8", "--adam_beta2", "0.95"]
    assert_ok(train(cache_dir, out, "--max_steps", "3", "--save_steps", "3", *betas))
    state = torch.load(out / "checkpoint-3" / "training_state.pt", weights_only=True)
    assert {tuple(g["betas"]) for g in state["optimizer"]["param_groups"]} == {(0.8, 0.95)}


def test_debug_false_keeps_the_one_line_error(tmp_path, cache_dir):
    """As programs: --debug's traceback is the interpreter's, at the process's end (refused while parsing, before
    torch loads: a second each)."""
    proc = run(train_cmd("--learning_rate", "-1", "--debug", "false", "--output_dir", str(tmp_path / "x")), cache_dir)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().startswith("error: --learning_rate must be > 0"), proc.stderr
    debug = run(train_cmd("--learning_rate", "-1", "--debug", "--output_dir", str(tmp_path / "x")), cache_dir)
    assert "Traceback" in debug.stderr


def test_do_predict_writes_run_glues_predict_results(tmp_path, cache_dir):
    """A --test_file without labels (as GLUE's test sets come): one prediction per row, in file order, by
    label name; the predictions are the saved model's."""
    import pandas as pd

    from horovod_train.data import synthetic

    rows = synthetic.generate(9, seed=7)
    test_file = tmp_path / "test.jsonl"
    pd.DataFrame(rows).drop(columns=["label"]).to_json(test_file, orient="records", lines=True)
    out = tmp_path / "run"
    assert_ok(train(cache_dir, out, "--max_steps", "6", "--do_predict", "--test_file", str(test_file)))
    lines = (out / "predict_results.txt").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 10
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    batch = tokenizer([r["premise"] for r in rows], [r["hypothesis"] for r in rows], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = [model.config.id2label[i] for i in model(**batch).logits.argmax(-1).tolist()]
    assert lines[1:] == [f"{i}\t{label}" for i, label in enumerate(expected)]


def test_save_strategy_and_a_total_limit_of_none_mean_what_they_mean_in_transformers(tmp_path, cache_dir):
    every = tmp_path / "every"
    assert_ok(train(cache_dir, every, "--max_steps", "9", "--save_strategy", "steps", "--save_steps", "3",
                    "--save_total_limit", "None"))  # fmt: skip
    assert sorted(p.name for p in every.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6", "checkpoint-9"]
    none = tmp_path / "none"
    assert_ok(train(cache_dir, none, "--num_train_epochs", "1", "--save_strategy", "no"))
    assert not list(none.glob("checkpoint-*")) and (none / "all_results.json").is_file()
    refused = train(cache_dir, tmp_path / "zero", "--save_total_limit", "0")
    assert refused.returncode == 2 and "--save_strategy no" in refused.stderr, refused.stderr


def test_mnli_evaluates_matched_and_mismatched_from_a_saved_dataset(tmp_path, cache_dir):
    """As run_glue does for MNLI, from a DatasetDict a login node saved with save_to_disk: the matched set
    is the primary one (eval_accuracy), the mismatched one is prefixed with its split name."""
    from datasets import ClassLabel, Dataset, DatasetDict

    from horovod_train.data import synthetic

    def split(n: int, seed: int) -> Dataset:
        dataset = Dataset.from_list(synthetic.generate(n, seed))
        return dataset.cast_column("label", ClassLabel(names=list(synthetic.LABEL_NAMES)))

    saved = tmp_path / "glue_mnli"
    DatasetDict(train=split(600, 1), validation_matched=split(40, 2), validation_mismatched=split(50, 3)).save_to_disk(
        str(saved)
    )
    out = tmp_path / "run"
    proc = train_here(cache_dir, *SMALL_JOB, "--engine", "single", "--dataset_name", str(saved), "--task_name", "mnli",
                      "--max_steps", "10", "--output_dir", str(out))  # fmt: skip
    assert_ok(proc)
    results = read(out / "all_results.json")
    assert (results["eval_samples"], results["eval_validation_mismatched_samples"]) == (40, 50)
    metrics = {"eval_loss", "eval_accuracy", "eval_validation_mismatched_loss", "eval_validation_mismatched_accuracy"}
    assert metrics <= set(results) and "eval_f1" not in results  # run_glue's MNLI metric is accuracy alone
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("validation_matched accuracy ") and "(40 examples; chance 0.33)" in last, last
    assert "validation_mismatched accuracy " in last, last
    assert read(out / "config.json")["id2label"] == {"0": "entailment", "1": "neutral", "2": "contradiction"}


def test_every_option_of_train_has_a_description_and_a_default_grouped_by_section():
    from horovod_train.cli.main import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    groups = {g.title: [a for a in g._group_actions if a.option_strings] for g in train._action_groups}
    assert {"model arguments", "data arguments", "training arguments", "--engine horovod arguments",
            "--engine ddp arguments"} <= set(groups)  # fmt: skip
    options = [a for title, actions in groups.items() if title.endswith("arguments") for a in actions]
    run_options = [a for a in options if a.dest not in ("help", "config", "debug")]
    assert len(run_options) > 60
    for action in run_options:
        text = action.help or ""
        assert len(text) > 20 and "(default: " in text, (action.option_strings, text)
