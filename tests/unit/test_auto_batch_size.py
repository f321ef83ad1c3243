"""--auto_find_batch_size: the batch halves until a step fits, the accumulation doubling so that the global
batch is kept; on the CPU the batch is kept as given, and the run says so."""

from __future__ import annotations

import pytest
import torch
import transformers
from support.host_syncs import offline_cache  # noqa: F401 (a fixture)
from support.jobs import SMALL_JOB
from support.models import model_dir

from horovod_train.common.errors import UsageError
from horovod_train.config.parsing import parse_run_config
from horovod_train.engines.single import SingleEngine
from horovod_train.training.amp import Precision
from horovod_train.training.step import halve_until_fits, try_step
from horovod_train.training.trainer import Trainer


def step_that_fits(limit: int, tried: list[int]):
    """A step that runs out of CUDA memory (torch's own exception) above ``limit`` examples."""

    def step(batch: int) -> None:
        tried.append(batch)
        if batch > limit:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate for {batch} examples")

    return step


@pytest.mark.parametrize(("limit", "expected"), [(64, (64, 2)), (20, (16, 8)), (1, (1, 128))])
def test_the_batch_halves_until_a_step_fits_and_the_global_batch_is_kept(limit, expected):
    tried: list[int] = []
    assert halve_until_fits(step_that_fits(limit, tried), 64, 2) == expected
    batch, accumulation = expected
    assert batch * accumulation == 64 * 2 and tried == [64 >> i for i in range(len(tried))] and tried[-1] == batch


def test_a_batch_that_cannot_be_halved_further_is_refused_in_one_line():
    with pytest.raises(UsageError) as refused:
        halve_until_fits(step_that_fits(2, []), 12, 1)  # 12, 6, then 3 does not fit and is odd
    assert str(refused.value).startswith("--auto_find_batch_size: a step of 3 examples does not fit")


def test_other_errors_of_the_step_are_not_taken_for_a_full_memory():
    def broken(batch: int) -> None:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        halve_until_fits(broken, 8, 1)


def test_on_the_cpu_the_batch_is_kept_and_the_run_says_so(tmp_path, offline_cache, capsys):  # noqa: F811
    flags = ["--engine", "single", "--auto_find_batch_size", "--max_steps", "2", "--gradient_accumulation_steps", "2"]
    run_config = parse_run_config([*SMALL_JOB, *flags, "--output_dir", str(tmp_path / "run")])
    engine = SingleEngine(run_config)
    with engine.running():
        loop = Trainer(run_config, engine).setup()
    assert (loop.args.per_device_train_batch_size, loop.args.gradient_accumulation_steps) == (16, 2)
    assert loop.parts.plan.global_batch == 32
    said = capsys.readouterr().out
    assert "--auto_find_batch_size: no memory to probe on the CPU; --per_device_train_batch_size 16 as given" in said


def test_a_try_leaves_no_gradients_and_the_runs_random_numbers_as_they_were(tmp_path):
    """The try is a real forward and backward (here on the CPU, which has no limit to find), and the run after
    it draws the dropout masks and data order it would have drawn without it."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir(tmp_path, "bert"))
    state = torch.get_rng_state()
    calls = []
    model.register_forward_hook(lambda module, args, output: calls.append(output.loss.requires_grad))
    try_step(model, torch.device("cpu"), Precision("fp32", torch.device("cpu")), 4, 16)
    assert calls == [True] and torch.equal(torch.get_rng_state(), state)
    assert all(p.grad is None for p in model.parameters())
