"""The hot loop keeps the loss on the device (no host-device sync per step), and a loss that becomes NaN
or infinite stops the run with one line naming the step, found where the loss reaches the host anyway
(the log line). On the CPU a sync shows in a torch.profiler trace as aten::_local_scalar_dense, the op
behind .item(), int(tensor) and float(tensor), which on a GPU waits for every queued kernel."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from support.host_syncs import NaNFromStep
from support.jobs import SMALL_JOB

from horovod_train import engines
from horovod_train.cli import main
from horovod_train.engines.single import SingleEngine
from horovod_train.metrics import Meter, NonFiniteLoss


def test_meter_sums_stay_exact_and_name_the_first_non_finite_step():
    meter = Meter()
    batch = {"labels": torch.zeros(4), "attention_mask": torch.ones(4, 5, dtype=torch.int64)}
    for step, loss in enumerate([1.0, 2.0, float("nan"), float("inf"), 3.0], start=11):
        meter.add(torch.tensor(loss), batch, step)
    with pytest.raises(NonFiniteLoss) as stopped:
        meter.reduce(SingleEngine.__new__(SingleEngine), learning_rate=3e-3)
    assert stopped.value.step == 13
    assert str(stopped.value).startswith("the training loss became nan at step 13; fix: lower --learning_rate")
    assert "(this run: 0.003)" in str(stopped.value)
    finite = Meter()
    for loss in (1.0, 2.0):
        finite.add(torch.tensor(loss), batch, 1)
    logged = finite.reduce(SingleEngine.__new__(SingleEngine))
    assert logged["loss"] == 1.5 and logged["tokens_per_second"] > 0


def test_the_cli_prints_one_line_and_exits_2_on_a_nan_loss(tmp_path, offline_cache, monkeypatch, capsys):
    NaNFromStep.calls = 0
    monkeypatch.setitem(engines.ENGINES, "single", replace(engines.ENGINES["single"], engine=lambda: NaNFromStep))
    out = tmp_path / "run"
    args = [*SMALL_JOB, "--engine", "single", "--max_steps", "6", "--logging_steps", "3", "--output_dir", str(out)]
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and err[-1].startswith("error: the training loss became nan at step 5;")
