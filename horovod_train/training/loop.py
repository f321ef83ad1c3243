"""The training loop: epochs of optimizer steps from a position, each epoch ended by an evaluation and a
checkpoint. It knows nothing of Horovod or DDP: the engine does the gradient step and the collectives, and
the engine's policy says when the run is finished, where the learning rate stands and what follows a step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from horovod_train.config.run_config import TrainingArguments
from horovod_train.data.loaders import ahead_on_device
from horovod_train.engines.base import Engine
from horovod_train.training import amp
from horovod_train.training.evaluation import Evaluator
from horovod_train.training.metrics import Meter, audit_epoch
from horovod_train.training.parts import RunParts
from horovod_train.training.position import TrainingPosition
from horovod_train.training.progress import Console
from horovod_train.training.run_log import RunLog
from horovod_train.training.saving import CheckpointSaver
from horovod_train.training.schedule import Schedule
from horovod_train.training.step import accumulate_and_step
from horovod_train.training.stopping import StopSignals, TrainingStopped


class TrainingLoop:
    def __init__(
        self, engine: Engine, args: TrainingArguments, parts: RunParts, precision: amp.Precision,
        position: TrainingPosition, *, signals: StopSignals, console: Console, run_log: RunLog,
        evaluator: Evaluator, saver: CheckpointSaver,
    ) -> None:  # fmt: skip
        self.engine, self.args, self.parts, self.precision = engine, args, parts, precision
        self.policy, self.plan = parts.policy, parts.plan
        self.signals, self.console, self.run_log = signals, console, run_log
        self.evaluator, self.saver = evaluator, saver
        self.first_step = position.global_step  # where this process started: its throughput counts from here
        # What enter() (re)sets: where the loop stands, the learning rate there, the meter of the next log line.
        self.position = position
        self.schedule = self.new_schedule()
        self.meter = Meter()
        self.last_evaluation: tuple[int, dict[str, Any]] = (-1, {})  # (step, metrics)

    def train_epochs(self, position: TrainingPosition) -> dict[str, Any]:
        """Re-entrant: a policy whose world can change calls it again, from its last commit, after a resize.
        Returns the last evaluation."""
        self.enter(position)
        while position.epoch < self.plan.num_epochs and (
            not self.policy.finished(position) or self.epoch_open(position)
        ):
            completed = self.train_epoch(position)
            self.end_epoch(position, completed)
        evaluation = self.evaluation_at(position)
        evaluation = evaluation if evaluation is not None else self.evaluate(position)
        self.saver.complete()  # the last checkpoint written in the background is in place before the run ends
        return evaluation

    def epoch_open(self, position: TrainingPosition) -> bool:
        """Steps were taken in the current epoch but its end (evaluation, history, audit, checkpoint) has not
        come: a run stopped right after its last step resumes there and ends the epoch as the run would have."""
        ended_here = bool(position.history) and position.history[-1]["step"] == position.global_step
        return position.steps_in_epoch > 0 and not ended_here

    def enter(self, position: TrainingPosition) -> None:
        """(Re)start from ``position`` in the current world: its size, its learning rate, the bar."""
        self.position = position
        position.record_world_size(self.engine.world_size)
        self.schedule = self.new_schedule()
        self.schedule.apply(self.parts.optimizer, self.policy.schedule_step(position))
        # A step cut short (a worker lost inside the all-reduce) must not leave its gradients behind, nor a
        # collective in flight.
        self.parts.optimizer.zero_grad()
        self.signals.forget()
        self.console.bar.n = position.global_step
        self.run_log.enter(position)
        self.meter = Meter()

    def new_schedule(self) -> Schedule:
        args = self.args
        base_lr = self.engine.effective_learning_rate(args.learning_rate)
        return Schedule.create(
            base_lr, self.position.total_steps, args.warmup_steps, args.warmup_ratio, args.lr_scheduler_type
        )

    def train_epoch(self, position: TrainingPosition) -> bool:
        """Optimizer steps to the end of the epoch; False if the run finished inside it."""
        loader = self.parts.train_loader
        loader.sampler.begin_epoch(position.epoch, position.samples_in_epoch)
        batches = ahead_on_device(iter(loader), self.engine.device)
        self.parts.model.train()
        for _ in range(len(loader) // self.args.gradient_accumulation_steps):
            if self.policy.finished(position):
                return False
            self.train_step(batches, position)
            self.stop_if_signalled(position)
        return True

    def train_step(self, batches: Iterator[dict[str, torch.Tensor]], position: TrainingPosition) -> None:
        """One optimizer step: accumulate micro-batches, step, move the position and the learning rate."""
        args, engine, optimizer = self.args, self.engine, self.parts.optimizer
        accum = args.gradient_accumulation_steps
        micro_batches = (self.next_batch(batches, position) for _ in range(accum))

        def on_loss(loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
            self.meter.add(loss, batch, position.global_step + 1)

        examples, grad_norm = accumulate_and_step(  # this rank's examples in this step
            engine, self.parts.model, optimizer, self.precision, micro_batches, accum, args.max_grad_norm,
            args.label_smoothing_factor, on_loss,
        )  # fmt: skip
        self.meter.step(grad_norm)
        # What the batches held (an epoch's last may be partial); every rank's shard is padded to the same size.
        self.parts.train_loader.sampler.record_step(examples)
        position.advance(examples * engine.world_size)
        lr = self.schedule.apply(optimizer, self.policy.schedule_step(position))
        self.console.bar.update(1)
        every, finishing = self.plan.intervals, self.policy.finished(position)
        if position.global_step % every.logging == 0 or finishing:
            self.log_metrics(position, lr)
        if args.eval_strategy == "steps" and position.global_step % every.eval == 0:
            self.evaluate(position)
        # The step that finishes the run is saved once, by end_epoch, after the epoch's end (its evaluation, history).
        if every.save and args.save_strategy != "no" and position.global_step % every.save == 0 and not finishing:
            self.save_checkpoint(position)
        self.policy.after_step(position)

    def next_batch(self, batches: Iterator[dict[str, torch.Tensor]], position: TrainingPosition):
        """The next batch, already on the device (``ahead_on_device``)."""
        batch = next(batches)
        if self.args.audit_samples:  # asked for: a host read a step
            seen = self.engine.all_gather(batch.pop("example_index"))
            position.epoch_examples.extend(seen.cpu().tolist())
        return batch

    def log_metrics(self, position: TrainingPosition, learning_rate: float) -> None:
        reduced = self.meter.reduce(self.engine, self.args.learning_rate)  # stops the run on a NaN/inf loss
        self.meter = Meter()
        self.run_log.training(position, learning_rate, reduced)

    def end_epoch(self, position: TrainingPosition, completed: bool) -> None:
        """Evaluate, record the epoch, checkpoint; then the policy's epoch-end action."""
        result = self.evaluate(position) if self.args.eval_strategy == "epoch" else {}
        entry = {"epoch": position.epoch + 1, "step": position.global_step, **primary_metrics(result)}
        if self.args.audit_samples and completed:
            entry["samples"] = audit_epoch(position.epoch_examples, len(self.parts.train_set))
        position.history.append(entry)
        if completed:
            position.next_epoch()
        strategy = self.args.save_strategy
        if strategy == "epoch" or (strategy == "steps" and self.policy.finished(position)):
            self.save_checkpoint(position)
        self.policy.after_epoch(position)

    def evaluate(self, position: TrainingPosition) -> dict[str, Any]:
        result = self.evaluator.evaluate_all()
        self.run_log.evaluation(position, result)
        self.last_evaluation = (position.global_step, result)
        return result

    def evaluation_at(self, position: TrainingPosition) -> dict[str, Any] | None:
        """The metrics of an evaluation at the current step, if there was one."""
        step, result = self.last_evaluation
        return result if step == position.global_step else None

    def save_checkpoint(self, position: TrainingPosition) -> None:
        self.saver.save(position, self.schedule, self.evaluation_at(position))

    def stop_if_signalled(self, position: TrainingPosition) -> None:
        """At a step boundary: if any rank got a stop signal, checkpoint here and stop every rank."""
        received = self.signals.poll(self.engine)
        if received is None:
            return
        if self.saver.last_saved_step != position.global_step:
            self.save_checkpoint(position)
        self.saver.complete()
        self.engine.barrier()  # no rank exits (its launcher would end the job) before the checkpoint is complete
        saved = self.parts.checkpoints.target(position.global_step)
        raise TrainingStopped(
            f"stopped by {received} at step {position.global_step}: saved {saved.name} in {saved.parent}; "
            "continue with --resume_from_checkpoint auto"
        )


def primary_metrics(result: dict[str, Any]) -> dict[str, Any]:
    return {k: result[k] for k in ("eval_accuracy", "eval_f1", "eval_loss") if k in result}
