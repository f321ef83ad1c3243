"""LoRA runs end to end under Horovod (np=2): the best checkpoint's adapters loaded at the end, an output
directory that pipeline() and peft both load, and an exact resume from a mid-run checkpoint of that same run; a
checkpoint that from_pretrained loads as the trained model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import transformers
from safetensors.torch import load_file
from support.jobs import SMALL_JOB, assert_ok, horovodrun, read_results, run, train_here

pytestmark = pytest.mark.slow

LORA = ["--use_peft", "--lora_r", "4", "--learning_rate", "2e-3", "--synthetic_num_examples", "600"]
# 30 steps, evaluated and checkpointed every 10, the best checkpoint loaded at the end. "Best" is the highest loss,
# so that it is not the last checkpoint (the loss falls): loading it is seen.
BEST = [*SMALL_JOB, *LORA, "--max_steps", "30", "--eval_strategy", "steps", "--eval_steps", "10"]
BEST += ["--save_strategy", "steps", "--save_steps", "10", "--load_best_model_at_end"]
BEST += ["--metric_for_best_model", "eval_loss", "--greater_is_better", "true"]
# What a LoRA checkpoint and output hold of the model (checkpoint.py): merged weights, the adapter as peft saves it.
MODEL_FILES = ("model.safetensors", "adapter/adapter_model.safetensors")


def best_checkpoint(run_dir: Path) -> Path:
    return Path(json.loads((run_dir / "trainer_state.json").read_text())["best_model_checkpoint"])


@pytest.fixture(scope="module")
def best_run(tmp_path_factory, cache_dir) -> Path:
    """The job, launched once: the best-checkpoint test reads it, the resume test continues its checkpoint-10."""
    out = tmp_path_factory.mktemp("lora") / "full"
    assert_ok(run(horovodrun(2, *BEST, "--output_dir", str(out)), cache_dir))
    return out


def test_a_lora_run_resumes_exactly_from_a_mid_run_checkpoint(best_run, tmp_path, cache_dir):
    """lora_dropout 0.05 draws masks from every rank's generator: the resumed run repeats them exactly, through its
    evaluations, to the checkpoints it writes and to its output."""
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(best_run / "checkpoint-10", resumed / "checkpoint-10")
    proc = run(horovodrun(2, *BEST, "--output_dir", str(resumed), "--resume_from_checkpoint", "latest"), cache_dir)
    assert_ok(proc)
    assert "resumed from step 10" in proc.stdout
    # The output is the best checkpoint's (loaded at the end), maybe the copied one: the last checkpoint (the others
    # but the best are rotated away) holds what the resumed run trained.
    last = [f"checkpoint-30/{name}" for name in (*MODEL_FILES, "lora_state.safetensors")]
    for name in (*last, *MODEL_FILES):
        left, right = load_file(best_run / name), load_file(resumed / name)
        assert left.keys() == right.keys()
        difference = max(float((left[k] - right[k]).abs().max()) for k in left)
        print(f"{name}: max-abs difference after resume {difference:.3e}")
        assert difference == 0.0, name
    full, again = best_checkpoint(best_run), best_checkpoint(resumed)
    assert again.name == full.name and again.parent.resolve() == resumed.resolve(), (full, again)


def test_a_lora_checkpoint_loads_with_from_pretrained_as_the_trained_model(tmp_path, cache_dir):
    """The issue's command: from_pretrained("checkpoint-6") reported unexpected base_model.model.* keys and
    returned a randomly initialised model (max-abs 0.649 to the trained weights). The run ends at step 6, so its
    output directory holds the same trained model, merged."""
    out = tmp_path / "out"
    args = [*SMALL_JOB, *LORA, "--engine", "single", "--max_steps", "6", "--save_strategy", "steps"]
    args += ["--save_steps", "3"]
    assert_ok(train_here(cache_dir, *args, "--output_dir", str(out)))
    auto = transformers.AutoModelForSequenceClassification
    checkpoint, info = auto.from_pretrained(out / "checkpoint-6", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    final = auto.from_pretrained(out).state_dict()
    assert checkpoint.state_dict().keys() == final.keys()
    difference = max(float((checkpoint.state_dict()[k] - final[k]).abs().max()) for k in final)
    print(f"checkpoint-6 against the final merged model: max-abs {difference:.3e}")
    assert difference <= 1e-6
    from peft import PeftConfig

    assert PeftConfig.from_pretrained(str(out / "checkpoint-6" / "adapter")).r == 4


def test_the_best_lora_checkpoint_is_loaded_at_the_end_and_the_output_loads(best_run):
    out = best_run
    state = json.loads((out / "trainer_state.json").read_text())
    best = state["best_model_checkpoint"]
    assert best, state
    losses = {e["step"]: e["eval_loss"] for e in state["log_history"] if "eval_loss" in e}
    assert best.endswith(f"checkpoint-{max(losses, key=losses.get)}") and max(losses, key=losses.get) < 30, losses
    results = read_results(out)
    assert abs(results["eval_loss"] - max(losses.values())) < 1e-6, (results["eval_loss"], losses)

    classify = transformers.pipeline("text-classification", model=str(out), device="cpu")
    pair = {"text": "Ann put the cup next to the box in the hall .", "text_pair": "Ann put the box ."}
    assert classify([pair])[0]["label"] in {"entailment", "neutral", "contradiction"}
    from peft import PeftConfig, PeftModel

    adapter = out / "adapter"
    assert PeftConfig.from_pretrained(str(adapter)).r == 4
    # peft's own format: the adapter loads onto a model of its architecture (here the merged one).
    base = transformers.AutoModelForSequenceClassification.from_pretrained(out)
    adapted = PeftModel.from_pretrained(base, str(adapter))
    assert any("lora_A" in name for name, _ in adapted.named_parameters())
