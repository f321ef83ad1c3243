"""Adding an engine is one class and one row (issue 37): a toy engine defined here, in a test module, and put in
engines/table.py's ENGINE_CLASSES, is an --engine of `train`'s command line in this process. It holds the model
inside a wrapper of its own and builds the optimizer after wrapping, so a loop, checkpoint, evaluation or output
that read the model or the optimizer itself instead of asking the engine would fail; its checkpoint continues
under --engine single to the toy run's own parameters."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from safetensors.torch import load_file
from support.jobs import SMALL_JOB
from transformers import AutoModelForSequenceClassification

from horovod_train.cli.main import main
from horovod_train.engines import table
from horovod_train.engines.single import SingleEngine


class Held(torch.nn.Module):
    """The toy's wrapper: its own state dict's names (``inner.``...) are not the model's."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, **batch: torch.Tensor):
        return self.inner(**batch)


class ToyEngine(SingleEngine):
    name = "toy"
    calls: list[str] = []  # noqa: RUF012 (the test reads what the trainer asked of the engine)

    def prepare(
        self, model: torch.nn.Module, build_optimizer: Callable
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        self.calls.append("prepare")
        held = Held(model.to(self.device))
        return held, build_optimizer(held.inner)  # built after wrapping, over the model's own parameters

    def wrap(self, model, optimizer):
        raise AssertionError("the trainer asks prepare(), which builds the optimizer after wrapping")

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.inner

    def full_model_state(self, model):
        self.calls.append("full_model_state")
        return super().full_model_state(model)

    def full_optimizer_state(self, model, optimizer):
        self.calls.append("full_optimizer_state")
        return super().full_optimizer_state(model, optimizer)

    def eval_module(self, model):
        self.calls.append("eval_module")
        return super().eval_module(model)

    def clip_and_step(self, model, optimizer, max_grad_norm, scaler=None):
        self.calls.append("clip_and_step")
        super().clip_and_step(model, optimizer, max_grad_norm, scaler)


@pytest.fixture
def toy_row(monkeypatch) -> None:
    monkeypatch.setitem(table.ENGINE_CLASSES, "toy", f"{ToyEngine.__module__}:ToyEngine")
    monkeypatch.setattr(ToyEngine, "calls", [])


def test_an_engine_added_from_a_test_module_trains_checkpoints_and_resumes_elsewhere(tmp_path, offline_cache, toy_row):
    job = [*SMALL_JOB, "--synthetic_num_examples", "200", "--max_steps", "4", "--dropout", "0",
           "--save_strategy", "steps", "--save_steps", "2"]  # fmt: skip
    toy = tmp_path / "toy"
    assert main(["train", *job, "--engine", "toy", "--output_dir", str(toy)]) == 0
    assert json.loads((toy / "all_results.json").read_text())["engine"] == "toy"
    asked = set(ToyEngine.calls)
    assert {"prepare", "full_model_state", "full_optimizer_state", "eval_module", "clip_and_step"} <= asked, asked
    saved = load_file(toy / "model.safetensors")
    loaded = AutoModelForSequenceClassification.from_pretrained(toy).state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in saved.items())

    # The toy's checkpoint is the plain format: --engine single continues it to the toy's end.
    resumed = tmp_path / "resumed"
    assert main(["train", *job, "--engine", "single", "--output_dir", str(resumed),
                 "--resume_from_checkpoint", str(toy / "checkpoint-2")]) == 0  # fmt: skip
    again = load_file(resumed / "model.safetensors")
    assert max((again[name] - tensor).abs().max().item() for name, tensor in saved.items()) == 0.0


def test_doctor_names_the_engines_of_the_table(toy_row, capsys):
    """doctor's fix for --engine dp (one process for every device) lists the table's other engines, the toy's too."""
    with pytest.raises(SystemExit) as exited:
        main(["doctor", "--engine", "dp"])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: doctor joins a job with one process per rank; fix: use --engine ")
    named = err.split("use --engine ", 1)[1].split(" or ")
    assert set(named) == {"ddp", "fsdp", "horovod", "single", "zero1", "toy"}, named


def test_the_table_says_which_launcher_starts_an_engine_and_compare_follows_it(toy_row, monkeypatch):
    """LOCAL_LAUNCHERS, read without importing an engine (launch/slurm/ddp_torchrun.sbatch asks it before its job):
    each value a launcher row that starts ranks on one machine; a row without one is one plain process."""
    from horovod_train.launching import LAUNCHERS
    from horovod_train.launching.compare import supported_runs

    assert set(table.LOCAL_LAUNCHERS) <= set(table.ENGINE_CLASSES)
    assert all(LAUNCHERS[name].local for name in table.LOCAL_LAUNCHERS.values())
    assert table.local_launcher("toy") == "plain" and "toy" not in table.started_by("torchrun")
    assert not [run for run in supported_runs(2) if run.engine == "toy"]
    monkeypatch.setitem(table.LOCAL_LAUNCHERS, "toy", "torchrun")
    assert table.started_by("torchrun") == ["ddp", "fsdp", "zero1", "toy"]
    assert [(run.name, run.launcher) for run in supported_runs(2) if run.engine == "toy"] == [("toy-gloo", "torchrun")]
