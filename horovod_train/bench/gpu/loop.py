"""bench gpu's ``loop`` variant: the bucketed step as `train` takes it, through the training loop itself
(training/loop.py's TrainingLoop: its epochs and steps, the loader with its collator, pinned memory and the copy one
batch ahead, the meter kept on the device, the learning-rate schedule, the position, a log line with its host read
and metrics.jsonl record), on the bucketed variant's examples in their order, so that its row against the bucketed
row is what the loop adds to the bare step (issue 59: no more than 5%)."""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from typing import Any

import torch

from horovod_train.bench.gpu.batches import bucket_widths, make_examples
from horovod_train.bench.gpu.contender import Contender
from horovod_train.config.run_config import TrainingArguments
from horovod_train.engines.base import Engine
from horovod_train.outputs.run_directory import RunDirectory
from horovod_train.outputs.trackers import Trackers
from horovod_train.training.build import plan_run
from horovod_train.training.loop import TrainingLoop
from horovod_train.training.parts import RunParts
from horovod_train.training.position import TrainingPosition
from horovod_train.training.progress import Console
from horovod_train.training.run_log import RunLog
from horovod_train.training.stopping import StopSignals


def pad_only_tokenizer() -> Any:
    """A tokenizer for the training collator's padding alone (the examples are token ids already): BERT's pad id 0,
    on the right, as the other variants' batches are padded."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocabulary = WordLevel({"[PAD]": 0, "[UNK]": 1}, unk_token="[UNK]")
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(vocabulary), pad_token="[PAD]", unk_token="[UNK]")


class LoopContender(Contender):
    """The bucketed variant's model, optimizer and precision (the same seed: the same init), trained by a
    TrainingLoop whose loader batches the bucketed pool's examples in their order (a sequential sampler in place of
    the shuffling one: the same batches as the bare step's, window after window). The learning rate is constant,
    as the bare step's; no evaluation or checkpoint (the loop's own between epochs, not in its steady state). A
    window is a run of ``steps`` steps to the loop: its policy ends it there, after a log line (one per window,
    --logging_steps' default cadence of 50 at the default --steps), its metrics.jsonl in a temporary run directory,
    removed after."""

    def __init__(self, engine: Engine, args: argparse.Namespace, training: TrainingArguments) -> None:
        from datasets import Dataset

        from horovod_train.data.loaders import ResumableDistributedSampler, train_loader

        super().__init__(engine, args, training, "loop")
        chunks = make_examples(args, self.model.config.vocab_size)
        train_set = Dataset.from_list([example for chunk in chunks for example in chunk])
        sampler = ResumableDistributedSampler(train_set, num_replicas=1, rank=0, shuffle=False)
        batch = args.per_device_train_batch_size
        loop_args = dataclasses.replace(self.training, per_device_train_batch_size=batch, lr_scheduler_type="constant",
                                        eval_strategy="no", save_strategy="no", disable_tqdm=True,
                                        logging_steps=float(args.warmup + args.repeats * args.steps + 1))  # fmt: skip
        widths = bucket_widths(args, chunks)
        loader = train_loader(train_set, pad_only_tokenizer(), batch, 1, 0, args.seed, loop_args.dataloader_num_workers,
                              sampler=sampler, pin_memory=engine.device.type == "cuda", widths=widths)  # fmt: skip
        plan = plan_run(loop_args, len(loader), 1)
        policy = engine.policy(self.model, self.optimizer, sampler, len(train_set), self.precision.scaler)
        # What the loop reads in its steps; the rest of a run's parts (tokenizer, checkpoints, evaluation) it reads
        # only at an evaluation, a checkpoint or a stop signal, which this run has none of.
        parts = RunParts(tokenizer=None, tokenized=None, compatibility=None, model=self.model, optimizer=self.optimizer,
                         train_set=train_set, train_loader=loader, plan=plan, policy=policy, checkpoints=None,
                         widths=widths)  # fmt: skip
        self.run_dir = tempfile.TemporaryDirectory(prefix="bench-gpu-loop-")
        console = Console(engine)
        run_log = RunLog(engine, RunDirectory(self.run_dir.name), Trackers({}), console, plan)
        self.position = TrainingPosition()
        self.loop = TrainingLoop(engine, loop_args, parts, self.precision, self.position, signals=StopSignals([]),
                                 console=console, run_log=run_log, evaluator=None, saver=None)  # fmt: skip

    def train(self, batches: list[dict[str, torch.Tensor]]) -> None:
        """``len(batches)`` steps of the loop, from where it stood: its loader's batches are these."""
        position, loop = self.position, self.loop
        position.total_steps = position.global_step + len(batches)  # the policy ends the run here
        while not loop.policy.finished(position):
            loop.end_epoch(position, loop.train_epoch(position))

    def last_loss(self) -> float:
        """The loss the loop logged at the end of its last window: its steps' mean."""
        logged = [record["loss"] for record in self.position.log_history if "loss" in record]
        return logged[-1] if logged else float("nan")

    def close(self) -> None:
        self.run_dir.cleanup()  # the loop's metrics.jsonl
