"""The trainer: setup builds the run's parts, the loop trains, the end writes the results. It knows
nothing of Horovod or DDP: every collective goes through the engine, and the engine's policy says when
the run is finished, where the learning rate stands and what follows a step. Read ``Trainer.train``
first, then ``setup``; the parts are in ``horovod_train/training/``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from horovod_train.config.run_config import RunConfig
from horovod_train.data.labels import task_line
from horovod_train.data.sources import default_cache_dir
from horovod_train.data.splits import eval_split_names
from horovod_train.engines.base import Engine
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory, RunFiles
from horovod_train.outputs.trackers import Trackers
from horovod_train.training import amp, build, finish, resume, rng
from horovod_train.training.evaluation import Evaluator
from horovod_train.training.loop import TrainingLoop
from horovod_train.training.parts import RunParts
from horovod_train.training.position import TrainingPosition
from horovod_train.training.progress import Console
from horovod_train.training.rank_zero import RankZero
from horovod_train.training.run_log import RunLog
from horovod_train.training.saving import CheckpointSaver, load_best_weights
from horovod_train.training.step import fit_batch_size
from horovod_train.training.stopping import StopSignals, parse_signals


class Trainer:
    def __init__(self, config: RunConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        self.args = config.training
        self.cache_dir = Path(config.model.cache_dir) if config.model.cache_dir else default_cache_dir()
        self.precision = amp.Precision.from_args(self.args, engine.device)  # fp32: no autocast, no scaler
        if self.args.tf32 and engine.device.type == "cuda":
            amp.enable_tf32()
        self.console = Console(engine)  # rank 0's log lines; setup() starts the progress bar
        # rank 0 claims it first in setup(): one job per directory, which a fresh start empties of no input
        self.run_dir = RunDirectory(self.args.output_dir, reads=config.model.reads())
        # What setup() sets, in its order:
        self.signals = StopSignals([])  # the --checkpoint_signals, watched from setup() on
        self.rank_zero = RankZero(engine)  # knows whether this worker joins a running job
        self.parts: RunParts | None = None  # data, model, optimizer, loader, plan, policy, checkpoints
        self.finished_before: dict[str, Any] | None = None  # the results of a run that had already finished
        self.trackers = Trackers({})  # rank 0's --report_to trackers
        self.loop: TrainingLoop | None = None  # None after setup(): the run had already finished

    def train(self) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            loop = self.setup()
            if loop is None:
                return self.finished_before
            result = loop.policy.run(loop.train_epochs, loop.position)
            if self.args.load_best_model_at_end and self.load_best_model(loop):
                result = loop.evaluate(loop.position)  # the run's final evaluation is the best model's
            return self.finish(loop, result, time.perf_counter() - started)
        finally:
            self.signals.close()
            self.trackers.close()
            self.run_dir.release()

    # ---- setup -------------------------------------------------------------------------------
    def setup(self) -> TrainingLoop | None:
        """Everything the run needs, in order; nothing is written before every input is checked. None: the
        run in the output directory had already finished at the resumed step (``finished_before``)."""
        args, engine = self.args, self.engine
        self.signals = StopSignals(parse_signals(args.checkpoint_signals))
        rng.seed_everything(args.seed)
        # A worker added to a running job: it gets the job's state when it joins (the others are training,
        # so its setup takes part in no collective, and it loads no checkpoint) and writes nothing.
        recorded = self.run_dir.read_config()  # an elastic worker added later recognises its job's by it
        self.rank_zero = RankZero(engine, joining=engine.joins_running_job(recorded))
        # Locked before it is judged (a second job hears "in use"), and judged before anything is read.
        self.rank_zero.first(lambda: self.run_dir.claim(args.overwrite_output_dir, args.resume_from_checkpoint))
        self.parts, resumed = self.build_parts()
        position = build.start_position(resumed, self.parts.plan)
        in_place = bool(resumed and resumed["in_place"])
        if resumed:
            resume.restore_training_state(resumed, engine, self.parts.model, self.parts.optimizer, self.precision)
            if in_place and self.parts.policy.finished(position):
                self.finished_before = self.rank_zero.read_in_setup(
                    lambda: self.run_dir.read_finished(position.global_step)
                )
            if self.finished_before is not None:
                self.console.log(
                    f"the run in {self.run_dir.path} had already finished at step {position.global_step}: "
                    f"nothing to train, {RunFiles.FINISHED} left as it was"
                )
                return None
        # Every input has been validated: only now is anything written.
        if engine.is_main and not self.rank_zero.joining:
            self.write_run_config(fresh=not in_place)
        if engine.is_main:
            self.trackers = self.start_trackers()
        self.console.log(task_line(self.parts.tokenized))
        self.console.log(self.run_line(self.parts))
        if resumed:
            resume.restore_rng(resumed, engine)
        self.console.start_bar(position.total_steps, wanted=not args.disable_tqdm)
        self.loop = self.build_loop(self.parts, position)
        return self.loop

    def build_parts(self) -> tuple[RunParts, dict[str, Any] | None]:
        """The run's parts, and the checkpoint resumed from (None: a fresh start)."""
        config, args, engine = self.config, self.args, self.engine
        trained_labels = build.trained_labels(config)
        tokenizer, tokenized = build.prepare_data(config, engine, self.cache_dir, self.rank_zero, trained_labels)
        build.check_task_shape(args, tokenized, config.data.task_name)
        self.rank_zero.first(lambda: build.check_memory(config, engine, tokenizer, tokenized))
        model = build.build_model(config, tokenizer, tokenized, on_meta=engine.builds_model_on_meta)
        if args.auto_find_batch_size:
            fit_batch_size(args, engine, model, config.data.max_seq_length, self.console.log)
        compatibility = build.run_compatibility(config, engine, tokenizer, tokenized, model)
        resumed = None
        if args.resume_from_checkpoint and not self.rank_zero.joining:
            resumed = self.read_checkpoint(compatibility)
        if resumed is None and engine.is_main:  # the model starts from the pretrained one, not a checkpoint's
            build.warn_of_other_labels(config, trained_labels, tokenized, self.console.warn)
        # The engine builds the optimizer before or after wrapping (a sharded one steps its own shards).
        model, optimizer = engine.prepare(model, lambda module: build.build_optimizer(args, engine, module))
        if resumed:
            tensors = resumed.pop("tensors")  # whole, or the checkpoint each rank reads its part of
            engine.load_model_state(model, Path(tensors) if isinstance(tensors, str) else tensors)
        train_set = build.build_train_set(tokenized, args.audit_samples)
        widths = build.batch_widths(train_set, args, config.data)
        train_loader = build.build_train_loader(train_set, tokenizer, args, engine, widths)
        plan = build.plan_run(args, len(train_loader), engine.world_size)
        policy = engine.policy(model, optimizer, train_loader.sampler, len(train_set), self.precision.scaler)
        lineage = resumed["trainer_state"].get("lineage", []) if resumed else []  # [] for a checkpoint from elsewhere
        checkpoints = ckpt.Checkpoints(self.run_dir, args.save_total_limit, lineage)
        parts = RunParts(
            tokenizer=tokenizer, tokenized=tokenized, compatibility=compatibility, model=model, optimizer=optimizer,
            train_set=train_set, train_loader=train_loader, plan=plan, policy=policy, checkpoints=checkpoints,
            widths=widths,
        )  # fmt: skip
        return parts, resumed

    def read_checkpoint(self, compatibility: ckpt.Compatibility) -> dict[str, Any] | None:
        """The checkpoint to resume from, on every rank (rank 0 reads it), or None: a fresh start."""
        args = self.args
        return resume.load_checkpoint(
            self.rank_zero, self.console, self.run_dir, args.resume_from_checkpoint, args.overwrite_output_dir,
            compatibility, best_needed=args.load_best_model_at_end, whole=not self.engine.sharded_state,
        )  # fmt: skip

    def write_run_config(self, fresh: bool) -> None:
        self.run_dir.begin(fresh)
        self.run_dir.write_config({**self.config.to_dict(), **self.engine.describe()})

    def start_trackers(self) -> Trackers:
        name = self.run_dir.run_name(self.args.run_name)
        with self.run_dir.recording():
            return Trackers.create(self.args.report_to, self.run_dir.path, name, self.config.to_dict())

    def run_line(self, parts: RunParts) -> str:
        engine = self.engine
        splits = " ".join(f"{name}={len(parts.tokenized[name])}" for name in eval_split_names(parts.tokenized))
        return (
            f"engine={engine.name} world_size={engine.world_size} device={engine.device} "
            f"train={len(parts.train_set)} {splits} global_batch={parts.plan.global_batch} "
            f"steps={parts.plan.total_steps}"
        )

    def build_loop(self, parts: RunParts, position: TrainingPosition) -> TrainingLoop:
        engine = self.engine
        evaluator = Evaluator(engine, parts.model, parts.tokenizer, parts.tokenized, self.args, self.precision,
                              self.config.data.task_name, widths=parts.widths)  # fmt: skip
        return TrainingLoop(
            engine, self.args, parts, self.precision, position,
            signals=self.signals,
            console=self.console,
            run_log=RunLog(engine, self.run_dir, self.trackers, self.console, parts.plan),
            evaluator=evaluator,
            saver=CheckpointSaver(engine, parts, self.config, self.precision, self.run_dir),
        )  # fmt: skip

    # ---- the end -----------------------------------------------------------------------------
    def load_best_model(self, loop: TrainingLoop) -> bool:
        """--load_best_model_at_end: True if the best checkpoint's weights were loaded."""
        return load_best_weights(self.engine, loop.parts, loop.position, self.run_dir, self.rank_zero,
                                 self.console, self.args.metric_for_best_model)  # fmt: skip

    def finish(self, loop: TrainingLoop, evaluation: dict[str, Any], wall_time_s: float) -> dict[str, Any]:
        """Every rank's checksum and peak memory in the results; rank 0 writes model, tokenizer, results."""
        engine, parts, position = self.engine, loop.parts, loop.position
        self.signals.wait()  # the last step's stop flags are still being summed
        self.console.bar.close()
        train_metrics = finish.train_metrics(position, parts.plan, loop.first_step, len(parts.train_set), wall_time_s)
        summary = {**train_metrics, "epoch": parts.plan.epoch_float(position), "step": position.global_step}
        position.log_history.append(summary)
        evaluation = {**evaluation, **loop.evaluator.describe()}
        found = finish.gather_results(engine, parts.model, parts.plan, position, evaluation, train_metrics,
                                       wall_time_s)  # fmt: skip
        predictions = loop.evaluator.predict() if self.args.do_predict else {}
        saved = finish.write_model(engine, parts.model, self.run_dir, self.args.max_shard_size)
        if engine.is_main:
            state = finish.trainer_state(self.args, self.run_dir, parts.plan, position)
            outputs = finish.outputs(self.run_dir, engine.unwrap(parts.model), predictions, loop.evaluator.shape,
                                     position.log_history, found, train_metrics, state,
                                     self.config.to_dict())  # fmt: skip
            self.run_dir.write_outputs(outputs, save=parts.tokenizer.save_pretrained, widen=saved)
        return found
