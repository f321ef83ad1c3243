"""Writing checkpoints (collective: every rank's RNG states go into the one rank 0 writes), tracking the
best by --metric_for_best_model, and loading the best at the end."""

from __future__ import annotations

import dataclasses
import shutil
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

    def save(self, position: TrainingPosition, schedule: Schedule, evaluation: dict[str, Any] | None) -> None:
        """``evaluation``: the metrics of an evaluation at this very step, if there was one."""
        engine, model, optimizer = self.engine, self.parts.model, self.parts.optimizer
        rng_states = engine.gather_objects(rng.capture())
        shards = None
        if engine.sharded_state:  # every rank writes its own part; rank 0 completes the checkpoint
            shards = self.write_shards(position.global_step)
            weights = None
            optimizer_state = ckpt.sharded_optimizer_state(optimizer)
        else:  # gathered on rank 0
            weights = engine.full_model_state(model)
            optimizer_state = engine.full_optimizer_state(model, optimizer)
        self.track_best(position, evaluation)
        # Rank 0 writes; its UsageError (a full disk) is every rank's, as the others would wait for it in the next
        # step's all-reduce.
        RankZero(engine).read_for_all(
            lambda: self.write(position, schedule, rng_states, weights, optimizer_state, shards)
        )
        self.last_saved_step = position.global_step

    def write_shards(self, step: int) -> tuple[Path, dict[str, str]]:
        """Every rank writes its part of the state into rank 0's temporary directory: that directory, and every
        file's SHA-256 the other ranks computed. A failure is every rank's, the temporary directory removed."""
        engine, checkpoints = self.engine, self.parts.checkpoints

        def temporary() -> str:
            with ckpt.refusing_a_full_disk(checkpoints.target(step)):
                return str(checkpoints.temporary(step))

        directory = Path(RankZero(engine).read_for_all(temporary))
        try:  # a rank's failure is every rank's (Engine.save_state_shards)
            written = engine.save_state_shards(self.parts.model, self.parts.optimizer, directory)
        except Exception as error:
            if engine.is_main:
                shutil.rmtree(directory, ignore_errors=True)
            if disk_full(error):
                with ckpt.refusing_a_full_disk(checkpoints.target(step)):
                    raise
            raise
        return directory, {name: digest for part in engine.gather_objects(written) for name, digest in part.items()}

    def write(
        self, position: TrainingPosition, schedule: Schedule, rng_states: list[Any], weights: dict[str, Any] | None,
        optimizer_state: dict[str, Any] | None, shards: tuple[Path, dict[str, str]] | None = None,
    ) -> None:  # fmt: skip
        training_state = {
            "optimizer": optimizer_state,
            "rng": rng_states,
            # The schedule is a function of the position; its parameters are kept for the record.
            "scheduler": dataclasses.asdict(schedule),
            **self.precision.state_dict(),
        }
        model, tokenizer = self.engine.unwrap(self.parts.model), self.parts.tokenizer
        self.parts.checkpoints.save(
            model,
            position,
            self.parts.compatibility,
            self.config.to_dict(),
            training_state,
            write_loadable=lambda path: (model.config.save_pretrained(path), tokenizer.save_pretrained(path)),
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
