"""Smaller GPU-path items, each checked on the CPU: Horovod with --torch_compile at np=2, the
predivide factor with grouped all-reduces, a Horovod without NCCL on a CUDA machine, DataParallel's
per-GPU peak memory, and the start broadcast written from Horovod's thread."""

from __future__ import annotations

import threading

import pytest
import torch

from horovod_train.cli.main import main
from horovod_train.config.run_config import RunConfig, TrainingArguments
from horovod_train.engines.dp import DataParallelEngine
from horovod_train.engines.horovod import env as horovod_env
from horovod_train.engines.horovod.engine import rank_dependent_state
from horovod_train.engines.horovod.options import HorovodArguments


def test_predivide_factor_is_refused_with_explicit_groups(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--engine", "horovod", "--gradient_predivide_factor", "2", "--horovod_groups", "1",
              "--output_dir", str(out)])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--gradient_predivide_factor has no effect with --horovod_groups" in err[0]
    assert not out.exists()


def test_predivide_factor_turns_off_the_cpu_default_of_one_group():
    """Horovod 0.28.1's grouped all-reduce passes no prescale/postscale factor: the default of one group
    on CPUs would silently drop the factor, so it all-reduces per tensor instead."""
    params = [torch.zeros(4), torch.zeros(2)]
    assert horovod_env.optimizer_groups(HorovodArguments(), False, params) == [params[::-1]]
    assert horovod_env.optimizer_groups(HorovodArguments(gradient_predivide_factor=2.0), False, params) is None


def test_a_horovod_without_nccl_on_a_cuda_machine_is_warned_about():
    import horovod.torch as hvd  # this machine's Horovod: built without NCCL (no CUDA torch)

    assert not hvd.nccl_built()
    warning = horovod_env.nccl_warning(hvd, cuda=True)
    assert warning is not None and warning.startswith("warning: this Horovod was built without NCCL")
    assert horovod_env.nccl_warning(hvd, cuda=False) is None


def test_dp_reports_the_peak_memory_of_every_replicas_gpu(monkeypatch):
    """peak_memory_mb_per_rank holds GPU 0's peak only (one process); the replicas' GPUs are reported too.
    Faked: this machine has no GPU."""
    peaks = {0: 3 * 2**30, 1: 5 * 2**30}
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: peaks[device])
    engine = DataParallelEngine(RunConfig(training=TrainingArguments(engine="dp")))
    assert "peak_memory_mb_per_gpu" not in engine.describe()  # CPU: one replica, the process's RSS
    engine.device_ids = [0, 1]
    assert engine.describe()["peak_memory_mb_per_gpu"] == [3072.0, 5120.0]


def test_the_start_broadcast_can_be_written_from_horovods_thread():
    """A Horovod without GPU support writes a CUDA tensor's broadcast back with copy_ on its background thread, where
    autograd is on (grad mode is per thread): every tensor rank 0 sends must take that write, and the write must
    land in the model. Found on an H200 (the GPU check's two ranks on one GPU aborted in broadcast_parameters)."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    model[2].weight.requires_grad_(False)  # frozen (LoRA's base): not sent
    state = rank_dependent_state(model)
    assert "2.weight" not in state and {"0.weight", "1.running_mean", "2.bias"} <= set(state)
    errors: list[BaseException] = []

    def background_loop() -> None:  # as Horovod's callback: torch.is_grad_enabled() is True on a new thread
        try:
            assert torch.is_grad_enabled()
            for tensor in state.values():
                tensor.copy_(torch.full_like(tensor, 7))
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            errors.append(error)

    thread = threading.Thread(target=background_loop)
    thread.start()
    thread.join()
    assert not errors, errors
    assert bool((model[0].weight == 7).all()) and bool((model[1].running_mean == 7).all())
    assert not bool((model[2].weight == 7).any())
