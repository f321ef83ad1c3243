"""Resuming: rank 0 finds, verifies and reads the checkpoint and every rank loads it; a run that had already
finished at that step is recognised by its results."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from horovod_train import amp, rng
from horovod_train import checkpoint as ckpt
from horovod_train.engines.base import Engine
from horovod_train.output_dir import FINISHED_MARKER, check_fresh_start
from horovod_train.training.console import Console
from horovod_train.training.rank_zero import RankZero


def read_checkpoint(
    spec: str, output_dir: Path, overwrite: bool, compatibility: ckpt.Compatibility, warn: Callable[[str], None]
) -> ckpt.Payload | None:
    """Rank 0's read. None: ``auto`` found no valid checkpoint (and the run may start fresh)."""
    ckpt.clean_stale(output_dir)  # what a crash left: temporaries, a replaced checkpoint set aside
    found = ckpt.load_resumable(spec, output_dir, warn=warn)
    if found is None:
        check_fresh_start(output_dir, overwrite)
        return None
    path, payload = found
    compatibility.check(payload[2]["compatibility"], path, warn=warn)
    return payload


def load_checkpoint(
    model: torch.nn.Module, rank_zero: RankZero, console: Console, output_dir: Path, read: Callable[[], Any]
) -> dict[str, Any] | None:
    """Rank 0 reads (``read``) and broadcasts the checkpoint, every rank loads its weights into ``model``
    and raises the same error. The training state, with the trainer state under ``trainer_state``; None:
    no valid checkpoint, the run starts fresh."""
    payload = rank_zero.read_for_all(read)
    if payload is None:
        console.log(f"no valid checkpoint in {output_dir}: starting fresh")
        return None
    tensors, training_state, trainer_state = payload
    model.load_state_dict(ckpt.model_state(tensors, model))
    console.log(f"resumed from step {trainer_state['global_step']} (epoch {trainer_state['epoch']})")
    return {**training_state, "trainer_state": trainer_state}


def restore_training_state(resumed: dict[str, Any], optimizer: torch.optim.Optimizer, precision: amp.Precision) -> None:
    # After wrapping: Horovod's DistributedOptimizer is a new optimizer with empty state.
    # The groups' settings come back from the checkpoint; the implementation stays the one this run asked for.
    implementation = [group.get("fused") for group in optimizer.param_groups]
    optimizer.load_state_dict(resumed["optimizer"])
    for group, fused in zip(optimizer.param_groups, implementation, strict=True):
        group["fused"] = fused
    precision.load_state_dict(resumed)


def restore_rng(resumed: dict[str, Any], engine: Engine) -> None:
    """Each rank its own generators (a rank beyond the saved world takes rank 0's)."""
    states = resumed["rng"]
    rng.restore(states[engine.rank] if engine.rank < len(states) else states[0])


def read_finished_results(output_dir: Path, global_step: int) -> dict[str, Any] | None:
    """The results of a run that finished at ``global_step`` (its last file written), else None."""
    try:
        results = json.loads((output_dir / FINISHED_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return results if results.get("global_step") == global_step else None
