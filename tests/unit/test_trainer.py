"""The loop's policies: when a run is finished, where the learning rate stands, where a resumed run
starts; and the loop obeying whatever policy its engine supplies."""

from __future__ import annotations

import pytest
import torch
from support.jobs import SMALL_JOB
from transformers import get_scheduler

from horovod_train.config.domains import ADAMW_FUSED
from horovod_train.config.parsing import parse_run_config
from horovod_train.engines.horovod.elastic import ElasticPolicy
from horovod_train.engines.policy import RunPolicy
from horovod_train.engines.single import SingleEngine
from horovod_train.training import amp, build, resume
from horovod_train.training.position import TrainingPosition
from horovod_train.training.schedule import SCHEDULES, Schedule


def elastic_policy(train_examples: int, epochs: float, by_epochs: bool = True) -> ElasticPolicy:
    """Only its arithmetic is exercised here (tests/integration/test_elastic.py runs it under horovodrun)."""
    return ElasticPolicy(None, None, None, None, train_examples=train_examples, num_train_epochs=epochs,
                         by_epochs=by_epochs, commit_steps=5, on_reset=lambda: None)  # fmt: skip


def test_fixed_world_run_ends_at_total_steps_and_schedules_by_global_step():
    policy = RunPolicy()
    position = TrainingPosition(global_step=9, total_steps=10)
    assert not policy.finished(position) and policy.schedule_step(position) == 9
    position.advance(samples=32)
    assert policy.finished(position) and policy.schedule_step(position) == 10


def test_elastic_run_ends_by_epochs_and_schedules_by_data_seen():
    policy = elastic_policy(train_examples=1000, epochs=2)
    # Half of epoch 1 seen, at whatever world size: the schedule is at 3/4 of its length.
    position = TrainingPosition(global_step=77, epoch=1, samples_in_epoch=500, total_steps=100)
    assert policy.schedule_step(position) == 75 and not policy.finished(position)
    position.samples_in_epoch = 1000  # the epoch's data is all seen, even if its steps were fewer
    assert policy.finished(position)
    by_steps = elastic_policy(train_examples=1000, epochs=2, by_epochs=False)  # --max_steps given
    assert by_steps.schedule_step(position) == 77 and not by_steps.finished(position)


@pytest.mark.parametrize("kind", SCHEDULES)
@pytest.mark.parametrize(("warmup_steps", "warmup_ratio"), [(0, 0.0), (7, 0.0), (0, 0.1)])
def test_each_schedule_is_transformers_schedule(kind, warmup_steps, warmup_ratio):
    total, base = 50, 3e-4
    ours = Schedule.create(base, total, warmup_steps, warmup_ratio, kind)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
    theirs = get_scheduler(kind, optimizer, num_warmup_steps=ours.warmup_steps, num_training_steps=total)
    for step in range(total + 1):
        assert ours.base_lr * ours.factor(step) == pytest.approx(theirs.get_last_lr()[0], rel=1e-12, abs=0), step
        optimizer.step()
        theirs.step()
    assert ours.apply(optimizer, 10) == optimizer.param_groups[0]["lr"] == base * ours.factor(10)


def test_position_round_trips_through_a_checkpoint_record():
    position = TrainingPosition(global_step=12, epoch=1, steps_in_epoch=3, samples_in_epoch=48, total_steps=40,
                                history=[{"epoch": 1, "accuracy": 0.5}], world_sizes=[[0, 2]])  # fmt: skip
    record = {**position.to_dict(), "compatibility": {}, "config": {}}
    assert TrainingPosition.from_dict(record) == position
    position.next_epoch()
    assert (position.epoch, position.steps_in_epoch, position.samples_in_epoch) == (2, 0, 0)


def config(tmp_path, *args: str):
    return parse_run_config([*SMALL_JOB, "--engine", "single", "--synthetic_num_examples", "600",
                             "--output_dir", str(tmp_path / "run"), *args])  # fmt: skip


@pytest.mark.parametrize(("optim", "fused"), [("adamw_torch_fused", True), ("adamw_torch", None)])
def test_optim_picks_adamws_implementation_and_a_resume_keeps_it(optim, fused):
    config = parse_run_config(["--optim", optim, "--engine", "single"])
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
    optimizer = build.build_optimizer(config.training, SingleEngine(config), model)
    assert [g["fused"] for g in optimizer.param_groups] == [fused, fused]
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    # A checkpoint written by the other implementation: its state loads, this run's implementation stays.
    other = ADAMW_FUSED["adamw_torch" if fused else "adamw_torch_fused"]
    saved = optimizer.state_dict()
    for group in saved["param_groups"]:
        group["fused"] = other
    precision = amp.Precision("fp32", torch.device("cpu"))
    resume.restore_training_state({"optimizer": saved}, SingleEngine(config), model, optimizer, precision)
    assert [g["fused"] for g in optimizer.param_groups] == [fused, fused]
    assert optimizer.state_dict()["state"].keys() == saved["state"].keys()
    optimizer.step()
