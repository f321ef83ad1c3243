"""The training loop. It knows nothing of Horovod or DDP: every collective goes through the engine, and
the engine's policy says when the run is finished, where the learning rate stands and what follows a
step. Read ``Trainer.train`` first: setup, then epochs of steps, then the write-out.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import torch
from tqdm.auto import tqdm

from horovod_train import amp, outputs, rng
from horovod_train import checkpoint as ckpt
from horovod_train import data as data_lib
from horovod_train import model as model_lib
from horovod_train.config import RunConfig
from horovod_train.console import write_line
from horovod_train.engines.base import Engine
from horovod_train.errors import UsageError
from horovod_train.files import follow_umask, write_json_atomic
from horovod_train.memory import peak_memory_mb
from horovod_train.metrics import Meter, audit_epoch, exact_metrics
from horovod_train.output_dir import (
    FINISHED_MARKER,
    OutputDirLock,
    check_fresh_start,
    record,
    recording,
    reset_output_dir,
)
from horovod_train.position import TrainingPosition
from horovod_train.schedule import Schedule
from horovod_train.stopping import StopSignals, TrainingStopped, parse_signals
from horovod_train.trackers import Trackers, plot_training_curves


class Trainer:
    def __init__(self, config: RunConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        self.args = config.training
        self.output_dir = Path(self.args.output_dir)
        self.cache_dir = Path(config.model.cache_dir) if config.model.cache_dir else data_lib.default_cache_dir()
        self.precision = amp.Precision.from_args(self.args, engine.device)  # fp32: no autocast, no scaler
        if self.args.tf32 and engine.device.type == "cuda":
            amp.enable_tf32()
        self.last_saved_step = -1
        self.step_examples = 0  # this rank's examples in the current optimizer step so far
        self.show_bar = False  # setup() draws one on rank 0 at a terminal
        self.last_evaluation: tuple[int, dict[str, Any]] = (-1, {})  # (step, metrics)
        self.signals = StopSignals([])  # train() watches the --checkpoint_signals while it runs
        self.trackers = Trackers({})  # rank 0's --report_to trackers, from setup() on
        self.lock = OutputDirLock(self.output_dir)  # rank 0 holds it from setup() on: one job per output directory
        self.finished_before: dict[str, Any] | None = None  # setup(): the results of a run that had already finished
        self.joining = False  # setup(): a worker that an engine adds to a running job

    def train(self) -> dict[str, Any]:
        started = time.perf_counter()
        self.signals = StopSignals(parse_signals(self.args.checkpoint_signals))
        try:
            self.setup()
            if self.finished_before is not None:
                self.log(f"the run in {self.output_dir} had already finished at step {self.position.global_step}: "
                         f"nothing to train, {FINISHED_MARKER} left as it was")
                return self.finished_before
            result = self.policy.run(self.train_epochs, self.position)
            if self.args.load_best_model_at_end:
                result = self.load_best_model(result)
            return self.finish(result, time.perf_counter() - started)
        finally:
            self.signals.close()
            self.trackers.close()
            self.lock.release()

    def log(self, message: str, file: TextIO | None = None) -> None:
        """Rank 0 only; above the progress bar when there is one."""
        if not self.engine.is_main:
            return
        if self.show_bar:
            tqdm.write(message, file=file)
        else:
            write_line(message, file)

    def warn(self, message: str) -> None:
        self.log(message, sys.stderr)

    # ---- setup -------------------------------------------------------------------------------
    def setup(self) -> None:
        args, engine = self.args, self.engine
        rng.seed_everything(args.seed)
        # A worker added to a running job: it gets the job's state when it joins (the others are training,
        # so its setup takes part in no collective, and it loads no checkpoint) and writes nothing.
        self.joining = engine.joins_running_job(args.output_dir)
        self.main_first(self.lock.acquire)  # before anything reads or cleans the output directory
        self.tokenizer, self.tokenized = self.prepare_data()
        self.check_metric_for_best_model()
        model = self.build_model()
        optimizer = self.build_optimizer(model)
        resumed = self.load_checkpoint(model) if args.resume_from_checkpoint and not self.joining else None
        self.model, self.optimizer = engine.wrap(model, optimizer)
        self.build_train_loader()
        self.position = self.start_position(resumed)
        self.first_step = self.position.global_step
        self.policy = engine.policy(
            self.model, self.optimizer, self.train_loader.sampler, len(self.train_set), self.precision.scaler
        )
        lineage = resumed["trainer_state"].get("lineage", []) if resumed else []
        self.checkpoints = ckpt.Checkpoints(self.output_dir, args.save_total_limit, lineage)
        if resumed:
            # After wrapping: Horovod's DistributedOptimizer is a new optimizer with empty state.
            self.optimizer.load_state_dict(resumed["optimizer"])
            self.precision.load_state_dict(resumed)
            if self.policy.finished(self.position):
                self.finished_before = self.main_reads(self.read_finished_results)
                if self.finished_before is not None:
                    return
        # Every input has been validated: only now is anything written.
        if engine.is_main and not self.joining:
            if not resumed:
                reset_output_dir(args.output_dir)
                record(self.output_dir, "run_config.json", "metrics.jsonl")
            # This attempt's configuration, resumed or not: a worker added later recognises its job by it.
            write_json_atomic(self.output_dir / "run_config.json", {**self.config.to_dict(), **engine.describe()})
        if engine.is_main:
            name = args.run_name or self.output_dir.resolve().name
            with recording(self.output_dir):
                self.trackers = Trackers.create(args.report_to, self.output_dir, name, self.config.to_dict())
        splits = " ".join(f"{name}={len(self.tokenized[name])}" for name in data_lib.eval_split_names(self.tokenized))
        self.global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * engine.world_size
        self.log(
            f"engine={engine.name} world_size={engine.world_size} device={engine.device} "
            f"train={len(self.train_set)} {splits} global_batch={self.global_batch} steps={self.position.total_steps}"
        )
        if resumed:  # each rank its own generators (a rank beyond the saved world takes rank 0's)
            states = resumed["rng"]
            rng.restore(states[engine.rank] if engine.rank < len(states) else states[0])
        # Under a launcher stderr is a pipe, not a terminal: no bar (its redraws garble tagged lines), a log line
        # per --logging_steps instead.
        self.show_bar = engine.is_main and sys.stderr.isatty() and not args.disable_tqdm
        self.progress = tqdm(total=self.position.total_steps, disable=not self.show_bar, desc="train")

    def main_first(self, work: Callable[[], None]) -> None:
        """Rank 0 does ``work`` before any other rank goes on, and its error is every rank's. An engine whose
        setup has no collective (workers join a running job): rank 0 alone, in the job's first setup."""
        if self.engine.collective_setup:
            self.read_on_main(work)
        elif self.engine.is_main and not self.joining:
            work()

    def prepare_data(self):
        c, engine = self.config, self.engine
        raw = data_lib.load_raw_datasets(c.data, self.args.seed, c.model.cache_dir)
        tokenizer_name = c.model.tokenizer_name or c.model.model_name_or_path
        if tokenizer_name == model_lib.TINY_BERT:
            texts = [t for column in data_lib.text_columns(raw) for t in raw["train"][column]]
            tokenizer_dir = model_lib.tiny_tokenizer_dir(self.cache_dir, texts)
            engine.local_main_first(lambda: model_lib.prepare_tiny_tokenizer(tokenizer_dir, texts))
            tokenizer_name = str(tokenizer_dir)
        access = model_lib.HubAccess(c.model.model_revision, c.model.token, c.model.trust_remote_code)
        tokenizer = engine.local_main_first(
            lambda: model_lib.load_tokenizer(tokenizer_name, c.model.cache_dir, access)
        )
        d = c.data
        cached = data_lib.tokenized_cache_path(raw, tokenizer, d.max_seq_length, self.cache_dir, d.pad_to_max_length)

        def tokenize(overwrite: bool = False) -> None:
            data_lib.tokenize_to_disk(raw, tokenizer, d.max_seq_length, cached, d.pad_to_max_length, overwrite)

        if d.overwrite_cache:  # rebuilt once, by rank 0, before any rank maps it (the cache may be shared by nodes)
            self.main_first(lambda: tokenize(overwrite=True))
        engine.local_main_first(tokenize)
        return tokenizer, data_lib.load_tokenized(cached)

    def check_metric_for_best_model(self) -> None:
        metric = self.args.metric_for_best_model
        if metric is None:
            return
        known = [f"{prefix}_{m}" for prefix in self.eval_prefixes().values() for m in ("loss", "accuracy", "f1")]
        if metric not in known:
            raise UsageError(f"--metric_for_best_model {metric} is not a metric of this run",
                             f"use one of {', '.join(known)}")

    def build_model(self) -> torch.nn.Module:
        c = self.config
        label_names = data_lib.label_names(self.tokenized)  # checked against --num_labels when the data loaded
        num_labels = len(label_names)
        model = model_lib.build_model(
            c.model.model_name_or_path,
            num_labels,
            label_names,
            len(self.tokenizer),
            self.args.seed,
            dropout=self.args.dropout,
            cache_dir=c.model.cache_dir,
            config_name=c.model.config_name,
            pad_token_id=self.tokenizer.pad_token_id,
            access=model_lib.HubAccess(c.model.model_revision, c.model.token, c.model.trust_remote_code),
        )
        if self.args.torch_compile:
            model.compile()  # in place: state_dict keys and save_pretrained are unchanged
        self.compatibility = self.run_compatibility(type(model).__name__, label_names)
        return model

    def run_compatibility(self, architecture: str, label_names: list[str]) -> ckpt.Compatibility:
        """What a checkpoint must agree with: the model, and what fixes the examples each step trains on (the
        tokenized training set, the seed and sampler that order it, the global batch)."""
        args = self.args
        return ckpt.Compatibility(
            self.config.model.model_name_or_path,
            len(label_names),
            len(self.tokenizer),
            architecture,
            self.engine.step_examples(args.per_device_train_batch_size * args.gradient_accumulation_steps),
            tokenizer=data_lib.tokenizer_digest(self.tokenizer),
            label_names=list(label_names),
            train_data=data_lib.dataset_digest(self.tokenized["train"]),
            seed=args.seed,
            group_by_length=args.group_by_length,
        )

    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight")
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = [
            {"params": [p for n, p in params if not n.endswith(no_decay)], "weight_decay": self.args.weight_decay},
            {"params": [p for n, p in params if n.endswith(no_decay)], "weight_decay": 0.0},
        ]
        lr = self.engine.effective_learning_rate(self.args.learning_rate)
        betas = (self.args.adam_beta1, self.args.adam_beta2)
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=self.args.adam_epsilon)

    def build_train_loader(self) -> None:
        args, engine = self.args, self.engine
        self.train_set = self.tokenized["train"]
        if args.audit_samples:
            self.train_set = self.train_set.add_column("example_index", list(range(len(self.train_set))))
        self.train_loader = data_lib.train_loader(
            self.train_set,
            self.tokenizer,
            args.per_device_train_batch_size,
            engine.world_size,
            engine.rank,
            args.seed,
            args.dataloader_num_workers,
            sampler=engine.train_sampler(self.train_set, args.seed),
            group_by_length=args.group_by_length,
            pin_memory=engine.device.type == "cuda",
            gradient_accumulation_steps=args.gradient_accumulation_steps,
        )

    def start_position(self, resumed: dict[str, Any] | None) -> TrainingPosition:
        """Plan the run's length from this world's steps per epoch, and start where a checkpoint left off."""
        accum = self.args.gradient_accumulation_steps
        self.steps_per_epoch = len(self.train_loader) // accum
        if self.steps_per_epoch == 0:
            raise UsageError(
                f"one optimizer step needs {accum} micro-batches per rank but a rank has {len(self.train_loader)}",
                "lower --gradient_accumulation_steps or --per_device_train_batch_size, or add data",
            )
        max_steps, epochs = self.args.max_steps, self.args.num_train_epochs
        total_steps = max_steps if max_steps > 0 else math.ceil(epochs * self.steps_per_epoch)
        self.num_epochs = math.ceil(total_steps / self.steps_per_epoch)
        position = TrainingPosition.from_dict(resumed["trainer_state"]) if resumed else TrainingPosition()
        position.total_steps = total_steps
        return position

    def load_checkpoint(self, model: torch.nn.Module) -> dict[str, Any] | None:
        """Rank 0 finds, verifies and reads the checkpoint and broadcasts it; every rank raises the same
        error. None: ``auto`` found no valid checkpoint, and the run starts fresh."""
        payload = self.read_on_main(self.read_checkpoint)
        if payload is None:
            self.log(f"no valid checkpoint in {self.output_dir}: starting fresh")
            return None
        tensors, training_state, trainer_state = payload
        model.load_state_dict(ckpt.with_shared_tensors(tensors, model))
        self.log(f"resumed from step {trainer_state['global_step']} (epoch {trainer_state['epoch']})")
        return {**training_state, "trainer_state": trainer_state}

    def main_reads(self, read: Callable[[], Any]) -> Any:
        """``read_on_main`` where setup may use collectives; else every rank reads for itself."""
        return self.read_on_main(read) if self.engine.collective_setup else read()

    def read_finished_results(self) -> dict[str, Any] | None:
        """The results of a run that finished at the resumed step (its last file written), else None."""
        try:
            results = json.loads((self.output_dir / FINISHED_MARKER).read_text())
        except (OSError, ValueError):
            return None
        return results if results.get("global_step") == self.position.global_step else None

    def read_on_main(self, read: Callable[[], Any]) -> Any:
        """Rank 0 reads (files may be on rank 0's node alone) and every rank gets the result, or raises the
        same error."""
        payload: Any = None
        if self.engine.is_main:
            try:
                payload = read()
            except UsageError as error:
                payload = error
        payload = self.engine.broadcast_object(payload)
        if isinstance(payload, UsageError):
            raise payload
        return payload

    def read_checkpoint(self) -> ckpt.Payload | None:
        ckpt.clean_stale(self.output_dir)  # what a crash left: temporaries, a replaced checkpoint set aside
        found = ckpt.load_resumable(self.args.resume_from_checkpoint, self.output_dir, warn=self.warn)
        if found is None:
            check_fresh_start(self.output_dir, self.args.overwrite_output_dir)
            return None
        path, payload = found
        self.compatibility.check(payload[2]["compatibility"], path, warn=self.warn)
        return payload

    # ---- the loop ----------------------------------------------------------------------------
    def train_epochs(self, position: TrainingPosition) -> dict[str, Any]:
        """Re-entrant: a policy whose world can change calls it again, from its last commit, after a resize."""
        self.enter(position)
        while position.epoch < self.num_epochs and (not self.policy.finished(position) or self.epoch_open(position)):
            completed = self.train_epoch(position)
            self.end_epoch(position, completed)
        step, result = self.last_evaluation
        return result if step == position.global_step else self.evaluate_all(position)

    def epoch_open(self, position: TrainingPosition) -> bool:
        """Steps were taken in the current epoch but its end (evaluation, history, audit, checkpoint) has not
        come: a run stopped right after its last step resumes there and ends the epoch as the run would have."""
        ended_here = bool(position.history) and position.history[-1]["step"] == position.global_step
        return position.steps_in_epoch > 0 and not ended_here

    def enter(self, position: TrainingPosition) -> None:
        """(Re)start from ``position`` in the current world: its size, its learning rate, the bar."""
        self.position = position
        position.record_world_size(self.engine.world_size)
        base_lr = self.engine.effective_learning_rate(self.args.learning_rate)
        args = self.args
        self.schedule = Schedule.create(
            base_lr, position.total_steps, args.warmup_steps, args.warmup_ratio, args.lr_scheduler_type
        )
        self.schedule.apply(self.optimizer, self.policy.schedule_step(position))
        # A step cut short (a worker lost inside the all-reduce) must not leave its gradients behind, nor a
        # collective in flight.
        self.optimizer.zero_grad()
        self.signals.forget()
        self.progress.n = position.global_step
        self.meter = Meter()

    def train_epoch(self, position: TrainingPosition) -> bool:
        """Optimizer steps to the end of the epoch; False if the run finished inside it."""
        accum = self.args.gradient_accumulation_steps
        self.train_loader.sampler.begin_epoch(position.epoch, position.samples_in_epoch)
        batches = iter(self.train_loader)
        self.model.train()
        for _ in range(len(self.train_loader) // accum):
            if self.policy.finished(position):
                return False
            self.train_step(batches, position)
            self.stop_if_signalled(position)
        return True

    def train_step(self, batches: Iterator[dict[str, torch.Tensor]], position: TrainingPosition) -> None:
        """One optimizer step: accumulate micro-batches, step, move the position and the learning rate."""
        args, engine, model = self.args, self.engine, self.model
        accum = args.gradient_accumulation_steps
        self.step_examples = 0
        for micro in range(accum):
            batch = self.next_batch(batches, position)
            with engine.accumulation_context(model, is_last_micro_step=micro == accum - 1):
                with self.precision.autocast():
                    loss = engine.forward_loss(model, batch, args.label_smoothing_factor)
                self.precision.backward(loss / accum)
            self.meter.add(loss.detach(), batch, position.global_step + 1)  # no .item(): no host sync
        engine.clip_and_step(model, self.optimizer, args.max_grad_norm, self.precision.scaler)
        self.optimizer.zero_grad()
        # What the batches held (an epoch's last may be partial); every rank's shard is padded to the same size.
        self.train_loader.sampler.record_step(self.step_examples)
        position.advance(self.step_examples * engine.world_size)
        lr = self.schedule.apply(self.optimizer, self.policy.schedule_step(position))
        self.progress.update(1)
        if position.global_step % args.logging_steps == 0 or self.policy.finished(position):
            self.log_metrics(position, lr)
        if args.eval_strategy == "steps" and position.global_step % (args.eval_steps or args.logging_steps) == 0:
            self.evaluate_all(position)
        if args.save_steps and args.save_strategy != "no" and position.global_step % args.save_steps == 0:
            self.save_checkpoint(position)
        self.policy.after_step(position)

    def next_batch(self, batches: Iterator[dict[str, torch.Tensor]], position: TrainingPosition):
        batch = next(batches)
        self.step_examples += len(batch["labels"])
        if self.args.audit_samples:
            seen = self.engine.all_gather(batch.pop("example_index").to(self.engine.device))
            position.epoch_examples.extend(seen.cpu().tolist())
        return {k: v.to(self.engine.device, non_blocking=True) for k, v in batch.items()}

    def log_metrics(self, position: TrainingPosition, learning_rate: float) -> None:
        record = {
            "step": position.global_step,
            "epoch": self.epoch_float(position),
            "learning_rate": learning_rate,
            "world_size": self.engine.world_size,
            **self.meter.reduce(self.engine, self.args.learning_rate),  # stops the run on a NaN/inf loss
        }
        self.meter = Meter()
        position.log_history.append({k: record[k] for k in ("loss", "learning_rate", "epoch", "step")})
        self.trackers.log(record, position.global_step)
        if self.engine.is_main:  # opened per record: after a resize rank 0 may be a new process
            with (self.output_dir / "metrics.jsonl").open("a") as f:
                f.write(json.dumps(record) + "\n")
        if self.show_bar:
            self.progress.set_postfix(loss=f"{record['loss']:.4f}")
        else:
            self.log(
                f"step {position.global_step}/{position.total_steps} epoch {record['epoch']:.2f} "
                f"loss {record['loss']:.4f} lr {learning_rate:.3e} {record['samples_per_second']:.1f} samples/s"
            )

    def epoch_float(self, position: TrainingPosition) -> float:
        return round(position.epoch + position.steps_in_epoch / max(self.steps_per_epoch, 1), 4)

    def end_epoch(self, position: TrainingPosition, completed: bool) -> None:
        """Evaluate, record the epoch, checkpoint; then the policy's epoch-end action."""
        result = self.evaluate_all(position) if self.args.eval_strategy == "epoch" else {}
        entry = {"epoch": position.epoch + 1, "step": position.global_step, **self.primary_metrics(result)}
        if self.args.audit_samples and completed:
            entry["samples"] = audit_epoch(position.epoch_examples, len(self.train_set))
        position.history.append(entry)
        if completed:
            position.next_epoch()
        strategy = self.args.save_strategy
        if strategy == "epoch" or (strategy == "steps" and self.policy.finished(position)):
            self.save_checkpoint(position)
        self.policy.after_epoch(position)

    @staticmethod
    def primary_metrics(result: dict[str, Any]) -> dict[str, Any]:
        return {k: result[k] for k in ("eval_accuracy", "eval_f1", "eval_loss") if k in result}

    def eval_prefixes(self) -> dict[str, str]:
        """Each validation split's metric prefix: ``eval`` for the first (primary), ``eval_<split>`` after."""
        names = data_lib.eval_split_names(self.tokenized)
        return {name: "eval" if i == 0 else f"eval_{name}" for i, name in enumerate(names)}

    def evaluate_all(self, position: TrainingPosition) -> dict[str, Any]:
        """Every validation split, keyed as transformers does: ``eval_<metric>`` for the first (primary)
        split, ``eval_<split>_<metric>`` for each other one (MNLI's validation_mismatched)."""
        started = time.perf_counter()
        result: dict[str, Any] = {}
        for name, prefix in self.eval_prefixes().items():
            result.update({f"{prefix}_{k}": v for k, v in self.evaluate(name).items()})
        result["eval_runtime"] = round(time.perf_counter() - started, 4)
        result["eval_samples_per_second"] = round(result["eval_samples"] / max(result["eval_runtime"], 1e-9), 3)
        position.log_history.append(
            {**{k: v for k, v in result.items() if not k.endswith("_per_rank")}, "epoch": self.epoch_float(position),
             "step": position.global_step}
        )
        self.last_evaluation = (position.global_step, result)
        self.trackers.log(position.log_history[-1], position.global_step)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in result.items() if k.endswith(("_accuracy", "_f1", "_loss")))
        self.log(f"eval at step {position.global_step}: {shown} ({result['eval_samples']} examples)")
        return result

    @torch.no_grad()
    def evaluate(self, split: str) -> dict[str, Any]:
        """Every example once over all ranks (the shard follows the current world size)."""
        engine, dataset = self.engine, self.tokenized[split]
        loader = data_lib.eval_loader(
            dataset, self.tokenizer, self.args.per_device_eval_batch_size, engine.world_size, engine.rank
        )
        net = engine.unwrap(self.model)
        net.eval()
        rows, losses = [torch.zeros((0, 3), dtype=torch.int64)], [torch.zeros(0, dtype=torch.float64)]
        for batch in loader:
            index = batch.pop("example_index")
            batch = {k: v.to(engine.device, non_blocking=True) for k, v in batch.items()}
            labels = batch.pop("labels")
            with self.precision.autocast():
                logits = net(**batch).logits
            loss = torch.nn.functional.cross_entropy(
                logits.float(), labels, reduction="none", label_smoothing=self.args.label_smoothing_factor
            )
            rows.append(torch.stack([index, logits.argmax(dim=-1).cpu(), labels.cpu()], dim=1))
            losses.append(loss.double().cpu())
        gathered = engine.all_gather(torch.cat(rows).to(engine.device))
        gathered_losses = engine.all_gather(torch.cat(losses).to(engine.device))
        result = exact_metrics(gathered.cpu(), gathered_losses.cpu(), len(dataset))
        per_rank = engine.all_gather(torch.tensor([result["accuracy"]], dtype=torch.float64, device=engine.device))
        result["accuracy_per_rank"] = per_rank.cpu().tolist()
        net.train()
        return result

    def save_checkpoint(self, position: TrainingPosition) -> None:
        """Collective: every rank's RNG states go into the checkpoint rank 0 writes."""
        rng_states = self.engine.gather_objects(rng.capture())
        self.track_best_checkpoint(position)
        if self.engine.is_main:
            training_state = {
                "optimizer": self.optimizer.state_dict(),
                "rng": rng_states,
                # The schedule is a function of the position; its parameters are kept for the record.
                "scheduler": dataclasses.asdict(self.schedule),
                **self.precision.state_dict(),
            }
            model = self.engine.unwrap(self.model)
            self.checkpoints.save(
                model, position, self.compatibility, self.config.to_dict(), training_state,
                write_loadable=lambda path: (model.config.save_pretrained(path), self.tokenizer.save_pretrained(path)),
            )
        self.last_saved_step = position.global_step

    def track_best_checkpoint(self, position: TrainingPosition) -> None:
        """A checkpoint written right after an evaluation competes on --metric_for_best_model (every rank
        holds the same metrics, so every rank's position agrees)."""
        metric = self.args.metric_for_best_model
        step, result = self.last_evaluation
        if metric is None or step != position.global_step:
            return
        value, best = result[metric], position.best_metric
        if best is None or (value > best if self.args.greater_is_better else value < best):
            position.best_metric = value
            # A name, not a path: the run directory may be moved between a checkpoint and its resume.
            position.best_model_checkpoint = f"{ckpt.PREFIX}{position.global_step}"

    def load_best_model(self, result: dict[str, Any]) -> dict[str, Any]:
        """--load_best_model_at_end: rank 0 reads and verifies the best checkpoint's weights, every rank loads
        them, and the run's final evaluation is that model's."""
        position = self.position
        best = position.best_model_checkpoint
        if best is None or Path(best).name == f"{ckpt.PREFIX}{position.global_step}":
            return result  # the final weights are the best ones (or nothing was ever compared)
        path = self.output_dir / Path(best).name  # earlier versions stored an absolute path
        weights = self.read_on_main(lambda: ckpt.load_weights(path))
        model = self.engine.unwrap(self.model)
        model.load_state_dict(ckpt.with_shared_tensors(weights, model))
        self.log(f"loaded the best model: {path} ({self.args.metric_for_best_model} {position.best_metric:.4f})")
        return self.evaluate_all(position)

    def stop_if_signalled(self, position: TrainingPosition) -> None:
        """At a step boundary: if any rank got a stop signal, checkpoint here and stop every rank."""
        received = self.signals.poll(self.engine)
        if received is None:
            return
        if self.last_saved_step != position.global_step:
            self.save_checkpoint(position)
        self.engine.barrier()  # no rank exits (its launcher would end the job) before the checkpoint is complete
        saved = f"saved {ckpt.PREFIX}{position.global_step}"
        raise TrainingStopped(
            f"stopped by {received} at step {position.global_step}: {saved} in {self.output_dir}; "
            "continue with --resume_from_checkpoint auto"
        )

    # ---- the write-out -----------------------------------------------------------------------
    def finish(self, result: dict[str, Any], wall_time_s: float) -> dict[str, Any]:
        """Every rank's checksum and peak memory in the results; rank 0 writes model, tokenizer, results."""
        engine, position = self.engine, self.position
        self.signals.wait()  # the last step's stop flags are still being summed
        self.progress.close()
        model = engine.unwrap(self.model)
        checksum = torch.tensor([model_lib.param_checksum(model)], dtype=torch.int64, device=engine.device)
        peak_memory = torch.tensor([peak_memory_mb(engine.device)], dtype=torch.float64, device=engine.device)
        train_metrics = self.train_metrics(position, wall_time_s)
        summary = {**train_metrics, "epoch": self.epoch_float(position), "step": position.global_step}
        position.log_history.append(summary)
        results = {
            **train_metrics,
            **result,
            **engine.describe(),
            "epoch": self.num_epochs,
            "global_step": position.global_step,
            "history": position.history,
            "world_size_changes": position.world_sizes,
            "param_checksum_per_rank": engine.all_gather(checksum).cpu().tolist(),
            "peak_memory_mb_per_rank": engine.all_gather(peak_memory).cpu().tolist(),
            "wall_time_s": round(wall_time_s, 3),
        }
        predictions = self.predict() if self.args.do_predict else {}
        if engine.is_main:
            with recording(self.output_dir):
                model.save_pretrained(self.output_dir)
                for weights in self.output_dir.glob("*.safetensors"):  # safetensors writes 0600 whatever the umask
                    follow_umask(weights)
                self.tokenizer.save_pretrained(self.output_dir)
                outputs.write_predictions(self.output_dir, predictions, model.config.id2label)
                plot_training_curves(position.log_history, self.output_dir / "training_curves.png")
                outputs.write_results(self.output_dir, results, train_metrics, self.trainer_state(position))
        return results

    def train_metrics(self, position: TrainingPosition, wall_time_s: float) -> dict[str, float]:
        """transformers' train_* summary: the mean logged loss, and throughput over this process's run."""
        losses = [entry["loss"] for entry in position.log_history if "loss" in entry]
        samples = (position.global_step - self.first_step) * self.global_batch
        return {
            "train_loss": sum(losses) / len(losses) if losses else float("nan"),
            "train_runtime": round(wall_time_s, 4),
            "train_samples": len(self.train_set),
            "train_samples_per_second": round(samples / max(wall_time_s, 1e-9), 3),
            "train_steps_per_second": round((position.global_step - self.first_step) / max(wall_time_s, 1e-9), 3),
        }

    def trainer_state(self, position: TrainingPosition) -> dict[str, Any]:
        args, best = self.args, position.best_model_checkpoint
        return {
            "global_step": position.global_step,
            "max_steps": position.total_steps,
            "epoch": self.epoch_float(position),
            "num_train_epochs": self.num_epochs,
            "logging_steps": args.logging_steps,
            "eval_steps": args.eval_steps or args.logging_steps,
            "save_steps": args.save_steps,
            "train_batch_size": args.per_device_train_batch_size,
            "is_world_process_zero": True,
            "best_metric": position.best_metric,
            # transformers' form: the output directory joined with the checkpoint's name
            "best_model_checkpoint": best and str(self.output_dir / Path(best).name),
            "log_history": position.log_history,
        }

    @torch.no_grad()
    def predict(self) -> dict[str, list[int]]:
        """Predictions of every test split, in example order (all ranks take part; rank 0 keeps them)."""
        engine, net = self.engine, self.engine.unwrap(self.model)
        net.eval()
        found = {}
        for name in data_lib.test_split_names(self.tokenized):
            dataset = self.tokenized[name]
            loader = data_lib.eval_loader(
                dataset, self.tokenizer, self.args.per_device_eval_batch_size, engine.world_size, engine.rank
            )
            rows = [torch.zeros((0, 2), dtype=torch.int64)]
            for batch in loader:
                index = batch.pop("example_index")
                batch = {k: v.to(engine.device) for k, v in batch.items() if k != "labels"}
                with self.precision.autocast():
                    rows.append(torch.stack([index, net(**batch).logits.argmax(dim=-1).cpu()], dim=1))
            gathered = engine.all_gather(torch.cat(rows).to(engine.device)).cpu()
            found[name] = gathered[torch.argsort(gathered[:, 0]), 1].tolist()
        net.train()
        return found
