"""Adding an engine is one module and one row (issues 37, 57): a toy engine defined here, in a test module, with an
option and a launcher of its own, and its row put in engines/specs.py's ENGINES, is an --engine of `train`'s command
line in this process, its option a flag of `train --help` checked by its domain, and a run of compare and bench. It
holds the model inside a wrapper of its own (under the name its option gives) and builds the optimizer after
wrapping, so a loop, checkpoint, evaluation or output that read the model or the optimizer itself instead of asking
the engine would fail; its checkpoint continues under --engine single to the toy run's own parameters.

Its launcher, toyrun, starts a run as this module run as a script, which puts the toy's rows in first: a fresh
``python -m horovod_train`` does not know the toy."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from support.jobs import SMALL_JOB
from transformers import AutoModelForSequenceClassification

from horovod_train.cli.main import main
from horovod_train.common.errors import UsageError
from horovod_train.config.run_config import RunConfig
from horovod_train.engines import specs
from horovod_train.engines.single import SingleEngine
from horovod_train.launching import LAUNCHERS
from horovod_train.launching.base import ONE_PROCESS, Launcher


def attribute_name(flag: str, value: Any) -> None:
    """--toy_hold_name's domain: a Python attribute name."""
    if not str(value).isidentifier():
        raise UsageError(f"--{flag} {value!r} is not an attribute name", f"pass e.g. --{flag} inner")


@dataclass
class ToyArguments:
    _argument_group_name = "--engine toy arguments"

    toy_hold_name: str = field(
        default="inner",
        metadata={"help": "The name the toy's wrapper holds the model under.", "domain": attribute_name},
    )

    def __post_init__(self) -> None:
        from horovod_train.config.domains import check_section

        check_section(self)


class Held(torch.nn.Module):
    """The toy's wrapper: its own state dict's names (``<toy_hold_name>.``...) are not the model's."""

    def __init__(self, inner: torch.nn.Module, name: str) -> None:
        super().__init__()
        self.name = name
        setattr(self, name, inner)

    def forward(self, **batch: torch.Tensor):
        return getattr(self, self.name)(**batch)


class ToyEngine(SingleEngine):
    name = "toy"
    calls: list[str] = []  # noqa: RUF012 (the test reads what the trainer asked of the engine)

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.hold_name = config.options(ToyArguments).toy_hold_name  # typed by its class

    def prepare(
        self, model: torch.nn.Module, build_optimizer: Callable
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        self.calls.append("prepare")
        held = Held(model.to(self.device), self.hold_name)
        return held, build_optimizer(self.unwrap(held))  # built after wrapping, over the model's own parameters

    def wrap(self, model, optimizer):
        raise AssertionError("the trainer asks prepare(), which builds the optimizer after wrapping")

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return getattr(model, self.hold_name)

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
        self.calls.append(f"clip_and_step under {model.name}")
        super().clip_and_step(model, optimizer, max_grad_norm, scaler)


class Toyrun(Launcher):
    """The toy's launcher: ``python -m horovod_train ...`` as one process of this module run as a script."""

    name, tool = "toyrun", "python"
    rendezvous = ONE_PROCESS

    def detects(self, env: Mapping[str, str]) -> bool:
        return False  # its process is a plain python one

    def command(self, program: Sequence[str], processes: int | None = None, **options: Any) -> list[str]:
        assert list(program[1:3]) == ["-m", "horovod_train"] and processes == 1, (program, processes)
        return [sys.executable, __file__, *program[3:]]

    def find_tool(self) -> str:
        return sys.executable

    def tool_installed(self) -> bool:
        return True


def _toy() -> type[ToyEngine]:
    return ToyEngine


TOY = specs.EngineSpec("toy", _toy, "toyrun", (specs.Variant("toy", "toyrun"),), options=ToyArguments,
                       foreign_flags={"toy_hold": "did you mean --engine toy --toy_hold_name?"})  # fmt: skip


@pytest.fixture
def toy_row(monkeypatch) -> None:
    monkeypatch.setitem(specs.ENGINES, "toy", TOY)
    monkeypatch.setitem(LAUNCHERS, "toyrun", Toyrun())
    monkeypatch.setattr(ToyEngine, "calls", [])


def test_an_engine_added_from_a_test_module_trains_checkpoints_and_resumes_elsewhere(tmp_path, offline_cache, toy_row):
    job = [*SMALL_JOB, "--synthetic_num_examples", "200", "--max_steps", "4", "--dropout", "0",
           "--save_strategy", "steps", "--save_steps", "2"]  # fmt: skip
    toy = tmp_path / "toy"
    assert main(["train", *job, "--engine", "toy", "--toy_hold_name", "kept", "--output_dir", str(toy)]) == 0
    assert json.loads((toy / "all_results.json").read_text())["engine"] == "toy"
    assert json.loads((toy / "run_config.json").read_text())["toy_hold_name"] == "kept"
    asked = set(ToyEngine.calls)
    wanted = {"prepare", "full_model_state", "full_optimizer_state", "eval_module", "clip_and_step under kept"}
    assert wanted <= asked, asked
    saved = load_file(toy / "model.safetensors")
    loaded = AutoModelForSequenceClassification.from_pretrained(toy).state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in saved.items())

    # The toy's checkpoint is the plain format: --engine single continues it to the toy's end.
    resumed = tmp_path / "resumed"
    assert main(["train", *job, "--engine", "single", "--output_dir", str(resumed),
                 "--resume_from_checkpoint", str(toy / "checkpoint-2")]) == 0  # fmt: skip
    again = load_file(resumed / "model.safetensors")
    assert max((again[name] - tensor).abs().max().item() for name, tensor in saved.items()) == 0.0


def test_the_toys_option_is_a_flag_of_train_checked_by_its_domain(toy_row, capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    shown = capsys.readouterr().out
    assert "--engine toy arguments:" in shown and "--toy_hold_name STR" in shown
    with pytest.raises(SystemExit) as exited:
        main(["train", "--engine", "toy", "--toy_hold_name", "9x", "--output_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2
    assert err == "error: --toy_hold_name '9x' is not an attribute name; fix: pass e.g. --toy_hold_name inner"
    assert not (tmp_path / "run").exists()


def test_another_tools_flag_that_means_the_toy_gets_the_hint_of_its_row(toy_row, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["train", "--toy_hold", "inner"])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and "fix: for --toy_hold, did you mean --engine toy --toy_hold_name?" in err, err


@pytest.mark.parametrize("engine", ["dp", "toyall"])
def test_doctor_names_the_engines_of_the_rows(toy_row, capsys, monkeypatch, engine):
    """doctor's fix for an engine whose one process drives every device (dp, and a toy row that says so) lists the
    rows' other engines, the toy's too."""
    monkeypatch.setitem(specs.ENGINES, "toyall", dataclasses.replace(TOY, name="toyall", process_per_rank=False))
    with pytest.raises(SystemExit) as exited:
        main(["doctor", "--engine", engine])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: doctor joins a job with one process per rank; fix: use --engine ")
    named = err.split("use --engine ", 1)[1].split(" or ")
    assert set(named) == {"ddp", "fsdp", "horovod", "single", "zero1", "toy"}, named


def run_here(cmd: list[str], log: Path, env: Mapping[str, str] | None = None) -> int:
    """compare's execute (compare's and bench's launches) for a one-process command line, in this process (a unit
    test starts no process): toyrun's, this module's script part, its rows already in; or a plain
    ``python -m horovod_train`` one (bench's single baseline). The output goes in ``log``."""
    script, module = [sys.executable, __file__], [sys.executable, "-m", "horovod_train"]
    assert env is None and (cmd[:2] == script or cmd[:3] == module), cmd
    with log.open("w") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        return main(cmd[2:] if cmd[:2] == script else cmd[3:])


def test_compare_and_bench_run_the_toy_under_its_own_launcher(toy_row, tmp_path, offline_cache, monkeypatch):
    """Its row names toyrun: compare's and bench's runs are read from the rows, and both start it with toyrun's
    command line (run in this process), on the same job: bench's run with compare's global batch as its per-rank
    batch (which compare's one process reads: 2 x 16 on a CPU machine) is compare's, to the same loss."""
    from horovod_train.bench.runs.train import plan
    from horovod_train.launching import compare

    assert specs.started_by("toyrun") == ["toy"]
    assert [(run.name, run.launcher) for run in plan([2], ["toy"])] == [("single", "plain"), ("toy", "toyrun")]
    monkeypatch.setattr(compare, "execute", run_here)
    out = tmp_path / "compared"
    job = ["--config", "demo", *SMALL_JOB, "--synthetic_num_examples", "200", "--max_steps", "4",
           "--logging_steps", "2", "--save_strategy", "no", "--toy_hold_name", "kept"]  # fmt: skip
    assert main(["compare", "--engines", "toy", *job, "--output_dir", str(out)]) == 0
    compared = json.loads((out / "compare.json").read_text())
    (row,) = compared["runs"]
    assert (row["name"], row["engine"], row["world_size"], row["ok"]) == ("toy", "toy", 1, True), row
    assert json.loads((out / "toy" / "run_config.json").read_text())["toy_hold_name"] == "kept"
    assert json.loads((out / "toy" / "all_results.json").read_text())["engine"] == "toy"

    benched = tmp_path / "benched"
    bench = ["bench", "train", "--engines", "toy", "--world_sizes", "2", *job,
             "--per_device_train_batch_size", str(compared["global_batch"])]  # fmt: skip
    assert main([*bench, "--output_dir", str(benched)]) == 0
    raw = {r["name"]: r for r in json.loads((benched / "bench_train.json").read_text())["raw"]}
    assert list(raw) == ["single", "toy"] and raw["toy"]["ok"] and raw["toy"]["samples_per_second"] > 0, raw
    assert json.loads((benched / "toy-np1-r0" / "all_results.json").read_text())["engine"] == "toy"
    assert math.isfinite(raw["toy"]["final_train_loss"])
    assert raw["toy"]["final_train_loss"] == row["final_train_loss"], (raw["toy"], row)


if __name__ == "__main__":  # toyrun's process: the toy's rows, then the command line it was given
    specs.ENGINES["toy"] = TOY
    LAUNCHERS["toyrun"] = Toyrun()
    sys.exit(main(sys.argv[1:]))
