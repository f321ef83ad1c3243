"""The hot loop keeps the loss on the device (no host-device sync per step), and a loss that becomes NaN
or infinite stops the run with one line naming the step, found where the loss reaches the host anyway
(the log line). On the CPU a sync shows in a torch.profiler trace as aten::_local_scalar_dense, the op
behind .item(), int(tensor) and float(tensor), which on a GPU waits for every queued kernel."""

from __future__ import annotations

import pytest
from support.host_syncs import NaNFromStep
from support.jobs import SMALL_JOB
from torch.profiler import ProfilerActivity, profile

from horovod_train.common.errors import UsageError
from horovod_train.config.parsing import parse_run_config
from horovod_train.data.loaders import ahead_on_device
from horovod_train.engines.single import SingleEngine
from horovod_train.training.trainer import Trainer

HOST_READS = ("aten::_local_scalar_dense", "aten::item")


def ancestors(event) -> list[str]:
    names = []
    while event is not None:
        names.append(event.name)
        event = event.cpu_parent
    return names


def chain(event) -> str:
    return " < ".join(ancestors(event))


def not_ours(event) -> bool:
    """AdamW reads its step counts, CPU tensors even on GPUs (not capturable): not a device sync. The
    model's own forward reads its attention mask (transformers' SDPA mask check, torch.all(mask == 1)):
    transformers' business, not the loop's."""
    return any(name.startswith(("Optimizer.step#", "nn.Module: ")) for name in ancestors(event))


def config(tmp_path, *args: str):
    return parse_run_config([*SMALL_JOB, "--engine", "single", "--synthetic_num_examples", "600",
                             "--output_dir", str(tmp_path / "run"), *args])  # fmt: skip


# The step with few shapes (issue 59): batches padded to buckets, the model compiled (dynamo alone: the point
# is what the step reads back, not Inductor's kernels).
COMPILED_BUCKETS = ("--length_buckets", "2", "--pad_to_multiple_of", "8", "--torch_compile_backend", "eager")


@pytest.mark.parametrize("flags", [(), COMPILED_BUCKETS], ids=["eager", "compiled-buckets"])
def test_training_steps_read_nothing_back_to_the_host_between_log_lines(tmp_path, offline_cache, flags):
    run_config = config(tmp_path, "--max_steps", "20", "--logging_steps", "100", "--gradient_accumulation_steps", "2",
                        *flags)  # fmt: skip
    engine = SingleEngine(run_config)
    with engine.running():
        loop = Trainer(run_config, engine).setup()
        loop.enter(loop.position)
        batches = ahead_on_device(iter(loop.parts.train_loader), engine.device)  # as train_epoch takes them
        loop.train_step(batches, loop.position)  # warm-up: lazy initialisations
        with profile(activities=[ProfilerActivity.CPU], with_stack=True) as trace:  # with Python frames
            for _ in range(4):
                loop.train_step(batches, loop.position)
        reads = [chain(e) for e in trace.events() if e.name in HOST_READS and not not_ours(e)]
        assert reads == [], f"{len(reads)} host reads in 4 steps (8 micro-batches)"
        assert loop.meter.micro_batches == 10
        logged = loop.meter.reduce(engine)  # the log line: one read of the sums and the last step's gradient norm
        assert logged["loss"] > 0 and logged["samples_per_second"] > 0 and logged["grad_norm"] > 0


def test_a_nan_loss_stops_the_run_naming_the_step_before_any_result_is_written(tmp_path, offline_cache):
    NaNFromStep.calls = 0
    run_config = config(tmp_path, "--max_steps", "12", "--logging_steps", "8", "--learning_rate", "0.5")
    engine = NaNFromStep(run_config)
    with engine.running(), pytest.raises(UsageError) as stopped:
        Trainer(run_config, engine).train()
    assert str(stopped.value).startswith("the training loss became nan at step 5; fix: lower --learning_rate")
    assert "(this run: 0.5)" in str(stopped.value)
    assert not (tmp_path / "run" / "all_results.json").exists()
