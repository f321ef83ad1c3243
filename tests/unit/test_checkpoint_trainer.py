"""`horovod-train checkpoint SRC DST --to trainer`: transformers' Trainer resumes our checkpoint where we left off.

A tiny Llama: its norms are named so that our rule (training/build.py) decays them and the Trainer's does not, so
the two optimizers number and group the parameters differently and the conversion must re-key the state."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from support.jobs import SMALL_JOB, assert_ok, cli_here, train_here
from support.models import model_dir

from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory
from horovod_train.training.build import decay_groups
from horovod_train.training.schedule import Schedule

SAVED_STEP, MAX_STEPS, BATCH, DECAY = 3, 5, 16, 0.01


class LoadedTrainer(transformers.Trainer):
    """The Trainer, keeping each parameter's optimizer state (by name) and the groups as the resume loaded them."""

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        names = {id(p): n for n, p in self.model.named_parameters()}
        groups = self.optimizer.param_groups
        self.loaded = {names[id(p)]: {k: v.clone() for k, v in self.optimizer.state[p].items()}
                       for group in groups for p in group["params"]}  # fmt: skip
        self.loaded_groups = [(group["weight_decay"], [names[id(p)] for p in group["params"]]) for group in groups]

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        self.loaded_rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


class LearningRates(transformers.TrainerCallback):
    def __init__(self) -> None:
        self.seen: dict[int, float] = {}

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        self.seen[state.global_step] = optimizer.param_groups[0]["lr"]


@pytest.fixture(scope="module")
def source(tmp_path_factory, cache_dir) -> Path:
    """Our checkpoint of step SAVED_STEP of a MAX_STEPS run (engine single, in this process)."""
    root = tmp_path_factory.mktemp("ours")
    job = [*SMALL_JOB[2:], "--synthetic_num_examples", "200", "--weight_decay", str(DECAY)]
    assert_ok(train_here(cache_dir, "--engine", "single", "--model_name_or_path", str(model_dir(root, "llama")),
                         *job, "--max_steps", str(MAX_STEPS), "--save_steps", str(SAVED_STEP),
                         "--output_dir", str(root / "run")))  # fmt: skip
    return RunDirectory(root / "run").checkpoint(SAVED_STEP)


def convert(source: Path, destination: Path):
    return cli_here(["checkpoint", str(source), str(destination), "--to", "trainer"], {})


def test_the_trainer_resumes_our_checkpoint_at_its_step_with_our_optimizer_state_and_schedule(source, tmp_path):
    destination = tmp_path / "for-trainer"
    assert_ok(convert(source, destination))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(destination)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "trainer-out"), max_steps=MAX_STEPS, per_device_train_batch_size=BATCH,
        learning_rate=2e-4, weight_decay=DECAY, lr_scheduler_type="linear", use_cpu=True, report_to=[],
        save_strategy="no", logging_steps=10, disable_tqdm=True,
    )  # fmt: skip
    data = [{"input_ids": torch.arange(i, i + 8) % 50 + 3, "attention_mask": torch.ones(8, dtype=torch.long),
             "labels": i % 3} for i in range(BATCH * MAX_STEPS)]  # fmt: skip
    rates = LearningRates()
    trainer = LoadedTrainer(model=model, args=args, train_dataset=data, callbacks=[rates])
    trainer.train(resume_from_checkpoint=str(destination))

    assert trainer.state.global_step == MAX_STEPS and sorted(rates.seen) == list(range(SAVED_STEP, MAX_STEPS))
    ours = torch.load(source / ckpt.STATE_FILE, weights_only=True)
    decayed, rest = decay_groups(model)  # our optimizer's numbering
    assert set(decayed) != {n for wd, names in trainer.loaded_groups if wd for n in names}, "the rules agree"
    for index, name in enumerate(decayed + rest):
        saved, loaded = ours["optimizer"]["state"][index], trainer.loaded[name]
        assert loaded["step"].item() == SAVED_STEP, name
        assert torch.equal(loaded["exp_avg"], saved["exp_avg"]) and torch.equal(
            loaded["exp_avg_sq"], saved["exp_avg_sq"]
        ), name
    # The Trainer's own groups: its decay rule, its weight decay on them.
    assert [wd for wd, _ in trainer.loaded_groups] == [DECAY, 0.0]
    # Our generators, as rank 0 saved them (rng.capture's lists).
    rng, loaded_rng = ours["rng"][0], trainer.loaded_rng
    assert loaded_rng["torch"].tolist() == rng["torch"] and list(loaded_rng["python"][1]) == rng["python"]["internal"]
    assert loaded_rng["numpy"][1].tolist() == rng["numpy"]["key"] and loaded_rng["numpy"][2] == rng["numpy"]["pos"]
    schedule = Schedule(**ours["scheduler"])
    assert rates.seen == {step: schedule.base_lr * schedule.factor(step) for step in range(SAVED_STEP, MAX_STEPS)}


def test_a_conversion_for_the_trainer_onto_an_existing_directory_is_refused(source, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    proc = convert(source, taken)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and f"error: {taken} exists" in lines[0], proc.stderr
    assert list(taken.iterdir()) == []


def test_a_sharded_checkpoint_converts_for_the_trainer_as_its_whole_form_does(source, tmp_path):
    sharded = tmp_path / "sharded" / source.name
    assert_ok(cli_here(["checkpoint", str(source), str(sharded), "--to", "sharded"], {}))
    for name, checkpoint in (("from-whole", source), ("from-sharded", sharded)):
        assert_ok(convert(checkpoint, tmp_path / name))
    whole, from_sharded = (torch.load(tmp_path / name / "optimizer.pt", weights_only=True)
                           for name in ("from-whole", "from-sharded"))  # fmt: skip
    assert (
        whole["param_groups"] == from_sharded["param_groups"] and whole["state"].keys() == from_sharded["state"].keys()
    )
    for index, entry in whole["state"].items():
        assert all(torch.equal(value, from_sharded["state"][index][key]) for key, value in entry.items())
