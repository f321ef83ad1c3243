"""Elastic Horovod: the loop runs under ``hvd.elastic.run`` and is re-entered from the last commit
after workers leave or join.

The policy ends the run by epochs (steps per epoch change with the world size), places the learning
rate by the data seen, and commits a ``TorchState`` (model, optimizer, Horovod's ``ElasticSampler``,
the training position and, with --fp16, the GradScaler) every ``--elastic_commit_steps`` steps and at
each epoch end.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn
from torch.optim import Optimizer

from horovod_train.engines.policy import RunPolicy
from horovod_train.training.position import TrainingPosition

T = TypeVar("T")


class ElasticPolicy(RunPolicy):
    def __init__(
        self,
        hvd: Any,
        model: nn.Module,
        optimizer: Optimizer,
        sampler: Any,
        *,
        train_examples: int,
        num_train_epochs: float,
        by_epochs: bool,
        commit_steps: int,
        on_reset: Callable[[], None],
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        self.hvd, self.model, self.optimizer, self.sampler = hvd, model, optimizer, sampler
        self.scaler = scaler
        self.train_examples, self.num_train_epochs, self.by_epochs = train_examples, num_train_epochs, by_epochs
        self.commit_steps, self.on_reset = commit_steps, on_reset
        self.state: Any = None

    def run(self, loop: Callable[[TrainingPosition], T], position: TrainingPosition) -> T:
        self.state = torch_state(self.hvd, self.model, self.optimizer, self.sampler, position, self.scaler)
        self.state.register_reset_callbacks([self.on_reset])
        # Horovod's ObjectState keeps references, not copies: the loop works on a copy of the committed
        # position, so that a rollback finds the commit unchanged.
        return self.hvd.elastic.run(lambda state: loop(copy.deepcopy(state.position)))(self.state)

    def finished(self, position: TrainingPosition) -> bool:
        if self.by_epochs:
            return position.epochs_done(self.train_examples) >= self.num_train_epochs
        return super().finished(position)

    def schedule_step(self, position: TrainingPosition) -> int:
        if self.by_epochs:  # the schedule follows the data seen, whatever the world size
            return round(position.total_steps * position.epochs_done(self.train_examples) / self.num_train_epochs)
        return super().schedule_step(position)

    def after_step(self, position: TrainingPosition) -> None:
        if position.global_step % self.commit_steps == 0:
            self.commit(position)

    def after_epoch(self, position: TrainingPosition) -> None:
        self.commit(position)

    def commit(self, position: TrainingPosition) -> None:
        self.state.position = copy.deepcopy(position)
        self.state.commit()


def torch_state(
    hvd: Any, model: nn.Module, optimizer: Optimizer, sampler: Any, position: TrainingPosition, scaler: Any = None
) -> Any:
    """The state elastic Horovod commits, restores after a failure and syncs from rank 0 after a resize."""
    # The optimizer is passed first so that its sync (broadcast_optimizer_state, which creates missing
    # state on joining workers with a dummy step that moves their parameters) runs before the
    # parameters are broadcast, and the joining workers end with rank 0's parameters exactly.
    parts: dict[str, Any] = {"opt": optimizer, "sampler": sampler, "model": model, "optimizer": None}
    if scaler is not None:  # --fp16: a joining worker would start at scale 65536 where the others backed off
        register_scaler_state()
        parts["scaler"] = scaler
    return hvd.elastic.TorchState(**parts, position=copy.deepcopy(position))


def register_scaler_state() -> None:
    """Teach TorchState the GradScaler: saved and restored by its state_dict, synced as rank 0's."""
    from horovod.torch.elastic import state
    from horovod.torch.functions import broadcast_object

    class ScalerStateHandler(state.StateHandler):
        def __init__(self, scaler: torch.amp.GradScaler) -> None:
            super().__init__(scaler)
            self.save()

        def save(self) -> None:
            self.saved = copy.deepcopy(self.value.state_dict())

        def restore(self) -> None:
            self.value.load_state_dict(self.saved)

        def sync(self) -> None:
            ours = broadcast_object(self.value.state_dict(), root_rank=0, name="horovod_train.grad_scaler")
            self.value.load_state_dict(ours)

    registry = state.get_handler_registry()
    if not any(kind is torch.amp.GradScaler for kind, _ in registry):
        state.set_handler_registry([*registry, (torch.amp.GradScaler, ScalerStateHandler)])


def make_elastic_sampler(dataset: Any, seed: int) -> Any:
    """Horovod's ElasticSampler behind the trainer's sampler interface (begin_epoch/record_step). It
    shards one seeded permutation strided over the ranks like DistributedSampler, counts the samples
    processed in the epoch, and on a resize re-shards the rest of the epoch over the new world."""
    from horovod.torch.elastic import ElasticSampler

    class ElasticTrainSampler(ElasticSampler):
        def begin_epoch(self, epoch: int, samples_in_epoch: int) -> None:
            # Always re-shard (load_state_dict recomputes the unprocessed indices for this world): a re-entry
            # that skipped Horovod's sync (a host removed while its workers live on) finds the sampler as the
            # epoch's start left it, counting the samples processed but still listing all of them.
            self.load_state_dict({"epoch": epoch, "processed_num": samples_in_epoch})

        def record_step(self, samples_per_rank: int) -> None:
            self.record_batch(0, samples_per_rank)

    return ElasticTrainSampler(dataset, shuffle=True, seed=seed)


def launch_id() -> str | None:
    """Identifies one horovodrun invocation (its rendezvous server), the same in every worker it starts."""
    addr, port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"), os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    return f"{addr}:{port}" if addr and port else None


def joins_running_job(recorded: dict[str, Any]) -> bool:
    """True for a worker that an elastic job adds later: the configuration its run directory recorded
    (``recorded``, {} where none) is its job's."""
    current = launch_id()
    return current is not None and recorded.get("launch_id") == current
