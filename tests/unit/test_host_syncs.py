"""The hot loop keeps the loss on the device (no host-device sync per step), and a loss that becomes NaN
or infinite stops the run with one line naming the step, found where the loss reaches the host anyway
(the log line). On the CPU a sync shows in a torch.profiler trace as aten::_local_scalar_dense, the op
behind .item(), int(tensor) and float(tensor), which on a GPU waits for every queued kernel."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from support.host_syncs import NaNFromStep
from support.jobs import SMALL_JOB

from horovod_train import engines
from horovod_train.cli.main import main
from horovod_train.config.run_config import RunConfig
from horovod_train.engines.single import SingleEngine
from horovod_train.training.amp import Precision
from horovod_train.training.metrics import Meter, NonFiniteLoss
from horovod_train.training.step import accumulate_and_step


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


class Tiny(torch.nn.Module):
    """A classifier with transformers' calling convention (``model(**batch).loss``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(loss=torch.nn.functional.cross_entropy(self.linear(input_ids), labels))


@pytest.mark.parametrize("max_grad_norm", [0.05, 0.0], ids=["clipped", "not-clipped"])
def test_a_step_gives_the_whole_gradients_norm_before_clipping_and_the_log_line_the_last_steps(max_grad_norm):
    """As HF's Trainer logs grad_norm: clip_grad_norm_'s return, the norm before clipping, of the last step."""
    engine, precision = SingleEngine(RunConfig()), Precision("fp32", torch.device("cpu"))
    generator = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randn(8, 4, generator=generator), "labels": torch.arange(8) % 3} for _ in range(3)]
    model, twin = Tiny(), Tiny()
    optimizer, twin_optimizer = torch.optim.SGD(model.parameters(), lr=1.0), torch.optim.SGD(twin.parameters(), lr=1.0)
    meter = Meter()
    for batch in batches:
        twin(**batch).loss.backward()  # by hand: the norm of every gradient entry, clipped, stepped
        expected = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in twin.parameters()]))
        if max_grad_norm:
            for p in twin.parameters():
                p.grad *= min(1.0, max_grad_norm / (float(expected) + 1e-6))
        twin_optimizer.step()
        twin_optimizer.zero_grad()
        step = accumulate_and_step(engine, model, optimizer, precision, iter([batch]), 1, max_grad_norm,
                                   on_loss=lambda loss, b: meter.add(loss, b))  # fmt: skip
        meter.step(step.grad_norm)
        assert step.examples == 8 and float(step.grad_norm) == pytest.approx(float(expected), rel=1e-6)
        assert float(expected) > 2 * max_grad_norm  # the clipped runs clip
        for ours, theirs in zip(model.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(ours, theirs)
    assert meter.reduce(engine)["grad_norm"] == pytest.approx(float(expected), rel=1e-6)
