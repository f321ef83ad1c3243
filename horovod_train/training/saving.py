"""Writing checkpoints (collective: every rank's RNG states go into the one rank 0 writes), tracking the
best by --metric_for_best_model, and loading the best at the end."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from horovod_train.common.files import disk_full
from horovod_train.config.run_config import RunConfig
from horovod_train.engines.base import Engine
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory
from horovod_train.training import amp, rng
from horovod_train.training.parts import RunParts
from horovod_train.training.position import TrainingPosition
from horovod_train.training.progress import Console
from horovod_train.training.rank_zero import RankZero
from horovod_train.training.schedule import Schedule


class CheckpointSaver:
    def __init__(
        self, engine: Engine, parts: RunParts, config: RunConfig, precision: amp.Precision, run_dir: RunDirectory
    ) -> None:
        self.engine, self.parts, self.config, self.precision, self.run_dir = engine, parts, config, precision, run_dir
        self.metric = config.training.metric_for_best_model
        self.greater_is_better = config.training.greater_is_better
        self.last_saved_step = -1
        # --save_async: an engine that writes in shards writes them beside training (save_in_background); one whose
        # state is whole on rank 0 writes it at once, as a background write would need a second copy of it there.
        self.in_background = config.training.save_async and engine.sharded_state
        self.pending: tuple[int, Path, Future[Path | None]] | None = None  # (step, temporary directory, the write)

    def save(self, position: TrainingPosition, schedule: Schedule, evaluation: dict[str, Any] | None) -> None:
        """``evaluation``: the metrics of an evaluation at this very step, if there was one."""
        self.complete()  # a checkpoint written in the background is in place before the next one begins
        engine, model, optimizer = self.engine, self.parts.model, self.parts.optimizer
        rng_states = engine.gather_objects(rng.capture())
        if self.in_background:
            self.save_in_background(position, schedule, rng_states, evaluation)
            return
        shards = None
        if engine.sharded_state:  # every rank writes its own part; rank 0 completes the checkpoint
            shards = self.write_shards(position.global_step)
            weights = None
            optimizer_state = ckpt.sharded_optimizer_state(optimizer)
        else:  # gathered on rank 0
            weights = engine.full_model_state(model)
            optimizer_state = engine.full_optimizer_state(model, optimizer)
        self.track_best(position, evaluation)
        training_state = self.training_state(schedule, rng_states, optimizer_state)
        # Rank 0 writes; its UsageError (a full disk) is every rank's, as the others would wait for it in the next
        # step's all-reduce.
        RankZero(engine).read_for_all(lambda: self.commit(position, training_state, weights, shards, self.loadable()))
        self.last_saved_step = position.global_step

    def save_in_background(
        self, position: TrainingPosition, schedule: Schedule, rng_states: list[Any], evaluation: dict[str, Any] | None
    ) -> None:
        """--save_async: every rank copies its part of the state at this step and a thread writes it while training
        goes on; once every rank's files are written, rank 0's thread writes the rest, the manifest last, and renames
        the checkpoint into place (``complete`` waits for that). Until then the newest checkpoint is the previous."""
        engine, step = self.engine, position.global_step
        background = engine.background_write()
        directory = self.temporary(step)
        with self.discarding(directory, step):
            engine.save_state_shards(self.parts.model, self.parts.optimizer, directory, background)
        training_state = self.training_state(schedule, rng_states, ckpt.sharded_optimizer_state(self.parts.optimizer))
        self.track_best(position, evaluation)
        at_step = copy.deepcopy(position)  # training moves the position on meanwhile
        failure: Exception | None = None
        if engine.is_main:  # what is read from the model itself, now (a whole model's file, config and tokenizer)
            try:
                ckpt.write_loadable_files(directory, engine.unwrap(self.parts.model), None, self.loadable())
            except Exception as error:  # every rank's, once the shards are written (complete)
                failure = error

        def then(digests: dict[str, str]) -> Path | None:
            if failure is not None:
                raise failure
            return self.commit(at_step, training_state, None, (directory, digests), None) if engine.is_main else None

        self.pending = (step, directory, background.start(directory, engine.rank, then))
        self.last_saved_step = step

    def complete(self) -> None:
        """Every rank: wait for the checkpoint written in the background, if any. A failure on any rank is every
        rank's, its temporary directory removed."""
        if self.pending is None:
            return
        step, directory, writing = self.pending
        self.pending = None
        with self.discarding(directory, step):  # the checkpoint, in place, recorded by the run directory (commit)
            self.engine.on_every_rank(writing.result)

    def temporary(self, step: int) -> Path:
        """Rank 0's temporary directory for step ``step``'s checkpoint, on every rank."""
        checkpoints = self.parts.checkpoints

        def temporary() -> str:
            with ckpt.refusing_a_full_disk(checkpoints.target(step)):
                return str(checkpoints.temporary(step))

        return Path(RankZero(self.engine).read_for_all(temporary))

    @contextlib.contextmanager
    def discarding(self, directory: Path, step: int) -> Iterator[None]:
        """A failure while step ``step``'s ``directory`` is written (raised on every rank) removes it; a full disk is
        a UsageError."""
        checkpoints = self.parts.checkpoints
        try:
            yield
        except Exception as error:
            if self.engine.is_main:
                shutil.rmtree(directory, ignore_errors=True)
            if disk_full(error):
                with ckpt.refusing_a_full_disk(checkpoints.target(step)):
                    raise
            raise

    def write_shards(self, step: int) -> tuple[Path, dict[str, str]]:
        """Every rank writes its part of the state into rank 0's temporary directory: that directory, and every
        file's SHA-256 the other ranks computed. A failure is every rank's, the temporary directory removed."""
        directory = self.temporary(step)
        with self.discarding(directory, step):  # a rank's failure is every rank's (Engine.save_state_shards)
            written = self.engine.save_state_shards(self.parts.model, self.parts.optimizer, directory)
        parts = self.engine.gather_objects(written)
        return directory, {name: digest for part in parts for name, digest in part.items()}

    def training_state(
        self, schedule: Schedule, rng_states: list[Any], optimizer_state: dict[str, Any] | None
    ) -> dict[str, Any]:
        return {
            "optimizer": optimizer_state,
            "rng": rng_states,
            # The schedule is a function of the position; its parameters are kept for the record.
            "scheduler": dataclasses.asdict(schedule),
            **self.precision.state_dict(),
        }

    def loadable(self) -> Callable[[Path], None]:
        """What ``from_pretrained`` needs besides the weights: the model's config, the tokenizer."""
        model, tokenizer = self.engine.unwrap(self.parts.model), self.parts.tokenizer
        return lambda path: (model.config.save_pretrained(path), tokenizer.save_pretrained(path))

    def commit(
        self, position: TrainingPosition, training_state: dict[str, Any], weights: dict[str, Any] | None,
        shards: tuple[Path, dict[str, str]] | None, write_loadable: Callable[[Path], None] | None,
    ) -> Path:  # fmt: skip
        """Rank 0: the checkpoint's remaining files, the manifest last, renamed into place; rotation."""
        return self.parts.checkpoints.save(
            self.engine.unwrap(self.parts.model),
            position,
            self.parts.compatibility,
            self.config.to_dict(),
            training_state,
            write_loadable=write_loadable,
            weights=weights,
            shards=shards,
        )

    def track_best(self, position: TrainingPosition, evaluation: dict[str, Any] | None) -> None:
        """A checkpoint written right after an evaluation competes on --metric_for_best_model (every rank
        holds the same metrics, so every rank's position agrees)."""
        if self.metric is None or evaluation is None:
            return
        value, best = evaluation[self.metric], position.best_metric
        if best is None or (value > best if self.greater_is_better else value < best):
            position.best_metric = value
            # A name, not a path: the run directory may be moved between a checkpoint and its resume.
            position.best_model_checkpoint = self.run_dir.checkpoint(position.global_step).name


def load_best_weights(
    engine: Engine, parts: RunParts, position: TrainingPosition, run_dir: RunDirectory, rank_zero: RankZero,
    console: Console, metric: str | None,
) -> bool:  # fmt: skip
    """--load_best_model_at_end: rank 0 reads and verifies the best checkpoint's weights and every rank
    loads them. False: the final weights are the best ones (or nothing was ever compared)."""
    best = position.best_model_checkpoint
    if best is None:
        return False
    path = run_dir.resolve(best)  # this run's own, or (resumed from elsewhere) the source run's
    if path == run_dir.checkpoint(position.global_step):
        return False
    weights = rank_zero.read_for_all(lambda: ckpt.load_weights(path))
    engine.load_model_state(parts.model, weights)
    console.log(f"loaded the best model: {path} ({metric} {position.best_metric:.4f})")
    return True
