"""Exact resume from any step, over drawn jobs (hypothesis): dataset size, per-device batch, world size,
gradient accumulation, --group_by_length, dropout, the save strategy and the step at which the run stops.
A run stopped there (by a real stop signal, or a crash that leaves only the checkpoint of that step) and
resumed with ``--resume_from_checkpoint auto`` must end with the parameters of the uninterrupted run
(max-abs 0.0), the same per-epoch history, and every epoch must have trained on each example once.

Single-rank draws run in this process; world size 2 is drawn at the sampler level (every rank's sampler
built here) and run for real by the sharded engines (zero1, fsdp) under torchrun, whose checkpoints gather the
optimizer's state from every rank, one job each (Horovod's and DDP's two-rank resume is test_checkpoint's). The
draws are derandomized and no example database is kept, so every run of the suite draws the same jobs."""

from __future__ import annotations

import math
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from support.jobs import SMALL_JOB, assert_ok, read_results, run, torchrun

from horovod_train.cli.main import quiet_libraries
from horovod_train.config.parsing import parse_run_config
from horovod_train.engines.policy import RunPolicy
from horovod_train.engines.single import SingleEngine
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory
from horovod_train.training.position import TrainingPosition
from horovod_train.training.stopping import TrainingStopped
from horovod_train.training.trainer import Trainer

DRAWS = settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

VALIDATION_PERCENT = 10


@dataclass(frozen=True)
class Job:
    examples: int  # --synthetic_num_examples; 10% are held out for validation
    batch: int  # --per_device_train_batch_size
    accumulation: int
    world_size: int
    group_by_length: bool
    dropout: float
    epochs: int  # --num_train_epochs, unless max_steps
    max_steps: int  # 0: by epochs
    save_strategy: str  # steps, epoch or no (a stop signal checkpoints whatever the strategy)
    save_steps: int

    @property
    def train_examples(self) -> int:
        return self.examples - math.ceil(VALIDATION_PERCENT / 100 * self.examples)

    @property
    def shard(self) -> int:
        """Examples per rank in an epoch (DistributedSampler pads to a multiple of the world size)."""
        return math.ceil(self.train_examples / self.world_size)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.shard / self.batch) // self.accumulation

    @property
    def total_steps(self) -> int:
        return self.max_steps or self.epochs * self.steps_per_epoch

    def args(self) -> list[str]:
        length = ["--max_steps", str(self.max_steps)] if self.max_steps else ["--num_train_epochs", str(self.epochs)]
        return [
            *SMALL_JOB, "--synthetic_num_examples", str(self.examples),
            "--per_device_train_batch_size", str(self.batch),
            "--gradient_accumulation_steps", str(self.accumulation),
            "--dropout", str(self.dropout), "--group_by_length", str(self.group_by_length).lower(),
            "--save_strategy", self.save_strategy, "--save_steps", str(self.save_steps),
            "--save_total_limit", "None", "--audit_samples", "--logging_steps", "5", *length,
        ]  # fmt: skip

    def expected_audit(self) -> dict[str, int] | None:
        """A complete epoch's audit when the drawn steps cover every rank's shard (None: they leave over
        micro-batches that make no full optimizer step, and which examples those are depends on the order)."""
        used = min(self.shard, self.steps_per_epoch * self.accumulation * self.batch)
        if used < self.shard:
            return None if self.world_size > 1 else {
                "dataset": self.train_examples, "trained_on": used, "skipped": self.train_examples - used,
                "repeated": 0,
            }  # fmt: skip
        padded = self.shard * self.world_size
        return {"dataset": self.train_examples, "trained_on": padded, "skipped": 0,
                "repeated": padded - self.train_examples}  # fmt: skip


@st.composite
def jobs(draw: st.DrawFn, world_size: int = 1, max_total_steps: int = 20) -> tuple[Job, int]:
    """A job and the step at which it stops (2..last: the stop signal is read one step after it arrives)."""
    batch = draw(st.integers(1, 16))
    accumulation = draw(st.integers(1, 3))
    examples = draw(st.integers(12, 120))
    train = examples - math.ceil(VALIDATION_PERCENT / 100 * examples)
    steps_per_epoch = math.ceil(math.ceil(train / world_size) / batch) // accumulation
    epochs = draw(st.integers(1, 2))
    max_steps = draw(st.one_of(st.just(0), st.integers(2, max(2, epochs * steps_per_epoch))))
    total = max_steps or epochs * steps_per_epoch
    assume(steps_per_epoch >= 1 and 2 <= total <= max_total_steps)
    strategy = draw(st.sampled_from(["steps", "epoch", "no"]))
    save_steps = draw(st.integers(1, 8)) if strategy == "steps" else draw(st.sampled_from([0, 3]))
    job = Job(
        examples, batch, accumulation, world_size, draw(st.booleans()), draw(st.sampled_from([0.0, 0.1])),
        epochs, max_steps, strategy, save_steps,
    )  # fmt: skip
    # Half of the draws stop at an epoch's last step or the run's last step, the rest anywhere.
    ends = [s for s in range(steps_per_epoch, total + 1, steps_per_epoch) if s >= 2] + [total]
    stop = draw(st.one_of(st.sampled_from(ends), st.integers(2, total)))
    return job, stop


class SignalAfter(RunPolicy):
    """Sends this process a real stop signal after ``step``: the run checkpoints and stops one step later."""

    def __init__(self, step: int) -> None:
        self.step = step

    def after_step(self, position: TrainingPosition) -> None:
        if position.global_step == self.step:
            os.kill(os.getpid(), signal.SIGUSR1)


def stopping_engine(step: int) -> type[SingleEngine]:
    class StoppedAfter(SingleEngine):
        def policy(self, *args) -> RunPolicy:
            return SignalAfter(step)

    return StoppedAfter


def train_in_process(job: Job, out: Path, cache: Path, *extra: str, engine_class=SingleEngine) -> dict:
    config = parse_run_config(
        [*job.args(), "--engine", "single", "--cache_dir", str(cache), "--output_dir", str(out), *extra]
    )
    engine = engine_class(config)
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        with engine.running():
            return Trainer(config, engine).train()
    finally:
        signal.signal(signal.SIGUSR1, previous)  # a stopped run leaves it ignored (for a launcher's late one)


def parameters(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / ckpt.MODEL_FILE)


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def check_audits(job: Job, history: list[dict]) -> None:
    completed = job.total_steps // job.steps_per_epoch
    audits = [entry["samples"] for entry in history if "samples" in entry]
    assert len(audits) == completed, history
    expected = job.expected_audit()
    for audit in audits:
        assert expected is None or audit == expected, (audit, expected)


def comparable(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k} for entry in history]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Iterator[Path]:
    quiet_libraries()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        yield tmp_path_factory.mktemp("resume-draws")


@example(draws=(Job(1200, 64, 1, 1, False, 0.0, 1, 20, "steps", 17), 17))
# An epoch ending in a partial batch inside an accumulated step, grouped by length, with dropout.
@example(draws=(Job(100, 8, 2, 1, True, 0.1, 2, 0, "epoch", 0), 6))
@given(draws=jobs())
@DRAWS
def test_a_run_stopped_at_any_step_resumes_exactly(draws: tuple[Job, int], workdir: Path, cache_dir: Path):
    job, stop = draws
    root = Path(tempfile.mkdtemp(dir=workdir))
    try:
        full = train_in_process(job, root / "full", cache_dir)
        with pytest.raises(TrainingStopped, match=f"at step {stop}:"):
            train_in_process(job, root / "stopped", cache_dir, engine_class=stopping_engine(stop - 1))
        assert (RunDirectory(root / "stopped").checkpoint(stop)).is_dir()
        resumed = train_in_process(job, root / "stopped", cache_dir, "--resume_from_checkpoint", "auto")
        diff = max_abs_diff(parameters(root / "full"), parameters(root / "stopped"))
        assert diff == 0.0, f"{job} stopped at {stop}: max-abs {diff:.3e}"
        assert resumed["global_step"] == full["global_step"] == job.total_steps
        assert comparable(resumed["history"]) == comparable(full["history"])
        check_audits(job, full["history"])
    finally:
        shutil.rmtree(root, ignore_errors=True)


# A job and its stop for each sharded engine, two ranks under torchrun: their checkpoints gather the optimizer's state
# from every rank. Horovod's and DDP's two-rank resume (exact, the same history) is
# tests/integration/test_checkpoint.py::test_two_ranks_resume_mid_epoch_with_dropout_and_every_ranks_generators.
TWO_RANK_JOBS = {
    "fsdp": (Job(200, 16, 2, 2, True, 0.1, 2, 0, "steps", 2), 3),
    "zero1": (Job(90, 8, 1, 2, False, 0.1, 2, 0, "epoch", 0), 7),
}


@pytest.mark.slow
@pytest.mark.parametrize("engine", tuple(TWO_RANK_JOBS))
def test_two_ranks_resume_exactly_from_a_checkpoint_of_any_step(engine: str, tmp_path_factory, cache_dir):
    """A crash after step ``stop`` leaves its checkpoint (saved every ``stop`` steps, the epoch's last
    included); a directory holding only that resumes to the uninterrupted run's parameters."""
    job, stop = TWO_RANK_JOBS[engine]
    stop = min(stop, job.total_steps - 1)  # the run's last checkpoint is rewritten at its end
    root = tmp_path_factory.mktemp("two-ranks")
    args = [*job.args(), "--engine", engine, "--save_strategy", "steps", "--save_steps", str(stop)]
    assert_ok(run(torchrun(2, *args, "--output_dir", str(root / "full")), cache_dir))
    resumed = root / "resumed"
    resumed.mkdir()
    shutil.copytree(RunDirectory(root / "full").checkpoint(stop), RunDirectory(resumed).checkpoint(stop))
    proc = run(torchrun(2, *args, "--output_dir", str(resumed), "--resume_from_checkpoint", "auto"), cache_dir)
    assert_ok(proc)
    assert f"resumed from step {stop}" in proc.stdout
    diff = max_abs_diff(parameters(root / "full"), parameters(resumed))
    assert diff == 0.0, f"{engine} {job} resumed at {stop}: max-abs {diff:.3e}"
    full, again = read_results(root / "full"), read_results(resumed)
    assert full["engine"] == again["engine"] == engine
    assert comparable(again["history"]) == comparable(full["history"])
    check_audits(job, full["history"])
    shutil.rmtree(root, ignore_errors=True)
