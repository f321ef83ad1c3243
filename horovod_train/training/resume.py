"""Resuming: rank 0 finds, verifies and reads the checkpoint and every rank loads it (a run that had already
finished at that step is the run directory's to recognise: ``RunDirectory.read_finished``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from horovod_train.engines.base import Engine
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory
from horovod_train.training import amp, rng
from horovod_train.training.progress import Console
from horovod_train.training.rank_zero import RankZero


def load_checkpoint(
    rank_zero: RankZero, console: Console, run_dir: RunDirectory, spec: str, overwrite: bool,
    compatibility: ckpt.Compatibility, best_needed: bool = False, whole: bool = True,
) -> dict[str, Any] | None:  # fmt: skip
    """Rank 0 reads (``read_checkpoint``) and broadcasts the checkpoint, every rank gets it or raises the same error.
    The training state, with the model's tensors under ``tensors`` (the engine loads them into the prepared model),
    the trainer state under ``trainer_state`` and ``in_place`` (the checkpoint is the run directory's own); None: no
    valid checkpoint, the run starts fresh."""

    def read() -> dict[str, Any] | None:
        return read_checkpoint(spec, run_dir, overwrite, compatibility, console.warn, best_needed, whole)

    resumed = rank_zero.read_for_all(read)
    if resumed is None:
        console.log(f"no valid checkpoint in {run_dir.path}: starting fresh")
        return None
    trainer_state = resumed["trainer_state"]
    console.log(f"resumed from step {trainer_state['global_step']} (epoch {trainer_state['epoch']})")
    return resumed


def read_checkpoint(
    spec: str, run_dir: RunDirectory, overwrite: bool, compatibility: ckpt.Compatibility, warn: Callable[[str], None],
    best_needed: bool = False, whole: bool = True,
) -> dict[str, Any] | None:  # fmt: skip
    """Rank 0's read: the checkpoint's training state, its trainer state (as this run refers to checkpoints)
    under ``trainer_state``, and whether the run continues in place. None: ``auto`` found no valid checkpoint
    (and the run may start fresh). ``whole``: False where every rank reads its own part of the model and optimizer
    state (Engine.sharded_state): ``tensors`` is then the checkpoint's directory."""
    found = ckpt.load_resumable(spec, run_dir, warn=warn, whole=whole)
    if found is None:
        run_dir.check_start_over(overwrite)
        return None
    path, (tensors, training_state, trainer_state) = found
    compatibility.check(trainer_state["compatibility"], path, warn=warn)
    in_place = ckpt.adopt(run_dir, trainer_state, path, warn, best_needed)
    tensors = tensors if whole else str(path.resolve())
    return {**training_state, "tensors": tensors, "trainer_state": trainer_state, "in_place": in_place}


def restore_training_state(
    resumed: dict[str, Any], engine: Engine, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
    precision: amp.Precision,
) -> None:  # fmt: skip
    # After prepare(): Horovod's DistributedOptimizer is a new optimizer with empty state, a sharded engine's
    # optimizer holds its own shards of the whole state the checkpoint has.
    engine.load_optimizer_state(model, optimizer, resumed["optimizer"])
    precision.load_state_dict(resumed)


def restore_rng(resumed: dict[str, Any], engine: Engine) -> None:
    """Each rank its own generators (a rank beyond the saved world takes rank 0's)."""
    states = resumed["rng"]
    rng.restore(states[engine.rank] if engine.rank < len(states) else states[0])
