"""transformers' --load_best_model_at_end / --metric_for_best_model / --greater_is_better,
--label_smoothing_factor and --config_name, with their meanings there. The same two-rank horovodrun job reports to
every tracker (--report_to all): one launch for both (the trackers' in-process tests are test_trackers.py's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.jobs import SMALL_JOB, assert_ok, horovodrun, read_results, run, train_here
from support.metrics import recompute_metrics
from support.trackers import offline_trackers
from transformers import BertConfig

from horovod_train.config.run_config import DataArguments


def read(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, cache_dir) -> Path:
    """Two ranks under horovodrun, 30 steps with an evaluation and a checkpoint every 6, the best model loaded at the
    end, every tracker fed (wandb offline, mlflow on a file store, tensorboard): the run's output directory."""
    root = tmp_path_factory.mktemp("two-ranks")
    out = root / "run"
    steps = ["--max_steps", "30", "--logging_steps", "6", "--eval_strategy", "steps", "--eval_steps", "6",
             "--save_strategy", "steps", "--save_steps", "6", "--save_total_limit", "1"]  # fmt: skip
    best = ["--load_best_model_at_end", "--metric_for_best_model", "loss", "--greater_is_better", "true"]
    trackers = ["--report_to", "all", "--run_name", "two-ranks"]
    args = [*SMALL_JOB, *steps, *best, "--label_smoothing_factor", "0.1", *trackers, "--output_dir", str(out)]
    with pytest.MonkeyPatch.context() as patch:
        offline_trackers(root, patch)
        assert_ok(run(horovodrun(2, *args), cache_dir, timeout=420))
    return out


@pytest.mark.slow
def test_best_checkpoint_is_kept_and_loaded_at_the_end_under_horovod(two_ranks):
    """Two ranks; the 'best' model is the one with the highest loss (--greater_is_better true), so that it
    is an early checkpoint, not the final weights. A total limit of 1 keeps it next to the newest, the run
    ends with its weights on both ranks, and its final evaluation (label-smoothed loss) is that model's."""
    out = two_ranks

    state = read(out / "trainer_state.json")
    evals = [(e["step"], e["eval_loss"], e["eval_accuracy"]) for e in state["log_history"] if "eval_loss" in e]
    assert [step for step, *_ in evals[:-1]] == [6, 12, 18, 24, 30]  # then the best model's own evaluation
    best_step, best_loss, best_accuracy = max(evals[:-1], key=lambda e: (e[1], -e[0]))  # the first of equals wins
    assert best_step != 30 and best_loss > evals[-2][1], evals  # the test needs an early best
    assert state["best_metric"] == best_loss and Path(state["best_model_checkpoint"]).name == f"checkpoint-{best_step}"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == sorted({f"checkpoint-{best_step}", "checkpoint-30"})

    final, kept = load_file(out / "model.safetensors"), load_file(out / f"checkpoint-{best_step}" / "model.safetensors")
    assert final.keys() == kept.keys() and all(torch.equal(final[k], kept[k]) for k in final)
    results = read_results(out)
    assert evals[-1][0] == 30 and evals[-1][1:] == pytest.approx((best_loss, best_accuracy), rel=1e-12)
    assert (results["eval_loss"], results["eval_accuracy"]) == evals[-1][1:]
    checksums = results["param_checksum_per_rank"]
    assert len(checksums) == 2 and checksums[0] == checksums[1]
    expected = recompute_metrics(out, DataArguments(synthetic_num_examples=1200), seed=42, label_smoothing=0.1)
    assert results["eval_loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert results["eval_accuracy"] == pytest.approx(expected["accuracy"], abs=1e-12)


@pytest.mark.slow
def test_report_to_all_from_a_two_rank_run_feeds_each_tracker_once(two_ranks, monkeypatch):
    """`--report_to all` under horovodrun: rank 0 alone starts one run per tracker, with the logged losses."""
    import mlflow

    offline_trackers(two_ranks.parent, monkeypatch)  # the job's stores, read in this process
    logged = [json.loads(line) for line in (two_ranks / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [6, 12, 18, 24, 30]

    runs = list((two_ranks.parent / "wandb-dir" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), runs
    (found,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert found.info.run_name == "two-ranks" and found.info.status == "FINISHED"
    history = mlflow.tracking.MlflowClient().get_metric_history(found.info.run_id, "loss")
    assert [m.step for m in history] == [6, 12, 18, 24, 30]
    assert [m.value for m in history] == pytest.approx([r["loss"] for r in logged], rel=1e-9)
    assert list((two_ranks / "runs").iterdir()) == [two_ranks / "runs" / "two-ranks"]  # tensorboard too, one writer


def test_config_name_random_inits_its_architecture_or_configures_a_pretrained_model(tmp_path, cache_dir):
    """With tiny-bert: the architecture of the given config, random init, the run's own vocabulary. With a
    saved model: its weights in the given configuration (here a different dropout), as run_glue.py does."""
    job = [*SMALL_JOB, "--engine", "single", "--max_steps", "2", "--synthetic_num_examples", "300"]
    architecture = tmp_path / "arch"
    BertConfig(hidden_size=48, num_hidden_layers=1, num_attention_heads=3, intermediate_size=96).save_pretrained(
        architecture
    )
    first = tmp_path / "first"
    assert_ok(train_here(cache_dir, *job, "--config_name", str(architecture), "--output_dir", str(first)))
    trained = read(first / "config.json")
    assert (trained["hidden_size"], trained["num_hidden_layers"], trained["num_attention_heads"]) == (48, 1, 3)
    assert trained["vocab_size"] < 30522 and len(trained["id2label"]) == 3  # the tiny tokenizer's vocabulary

    tuned = BertConfig.from_pretrained(first)
    tuned.hidden_dropout_prob = 0.25
    other = tmp_path / "other-config"
    tuned.save_pretrained(other)
    second = tmp_path / "second"
    assert_ok(train_here(cache_dir, *job, "--model_name_or_path", str(first), "--config_name", str(other),
                         "--learning_rate", "1e-12", "--output_dir", str(second)))  # fmt: skip
    assert read(second / "config.json")["hidden_dropout_prob"] == 0.25
    before, after = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert max((before[k] - after[k]).abs().max().item() for k in before) < 1e-6  # the first run's weights
