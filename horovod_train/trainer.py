"""The training loop. It knows nothing of Horovod or DDP: every collective goes through the engine."""

from __future__ import annotations

import collections
import hashlib
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from horovod_train import amp
from horovod_train import checkpoint as ckpt
from horovod_train import data as data_lib
from horovod_train import model as model_lib
from horovod_train.config import RunConfig
from horovod_train.engines.base import Engine
from horovod_train.errors import UsageError
from horovod_train.io import joins_running_job, launch_id, reset_output_dir, write_json_atomic
from horovod_train.memory import peak_memory_mb
from horovod_train.metrics import exact_accuracy

LABEL_NAMES_3 = ["entailment", "neutral", "contradiction"]


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def param_checksum(model: torch.nn.Module) -> int:
    """A 63-bit digest of every parameter's bytes: equal across ranks only if bit-identical."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return int.from_bytes(h.digest()[:8], "little") >> 1


@dataclass
class Meter:
    """Sums since the last log line, reduced over ranks when logged."""

    loss_sum: float = 0.0
    micro_batches: int = 0
    samples: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.perf_counter)

    def add(self, loss: float, batch: dict[str, torch.Tensor]) -> None:
        self.loss_sum += loss
        self.micro_batches += 1
        self.samples += batch["labels"].shape[0]
        self.tokens += int(batch["attention_mask"].sum())

    def reduce(self, engine: Engine) -> dict[str, float]:
        sums = engine.all_reduce_sum(
            torch.tensor([self.loss_sum, self.micro_batches, self.samples, self.tokens], dtype=torch.float64)
        ).tolist()
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return {
            "loss": sums[0] / max(sums[1], 1),
            "samples_per_second": sums[2] / elapsed,
            "tokens_per_second": sums[3] / elapsed,
        }


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

    def log(self, message: str) -> None:
        if self.engine.is_main:
            tqdm.write(message)

    # ---- setup -------------------------------------------------------------------------------
    def prepare_data(self):
        c, engine = self.config, self.engine
        raw = data_lib.load_raw_datasets(c.data, self.args.seed, c.model.cache_dir)
        tokenizer_name = c.model.tokenizer_name or c.model.model_name_or_path
        if tokenizer_name == model_lib.TINY_BERT:
            texts = [t for column in data_lib.TEXT_COLUMNS for t in raw["train"][column]]
            tokenizer_dir = model_lib.tiny_tokenizer_dir(self.cache_dir, texts)
            engine.local_main_first(lambda: model_lib.prepare_tiny_tokenizer(tokenizer_dir, texts))
            tokenizer_name = str(tokenizer_dir)
        tokenizer = engine.local_main_first(lambda: model_lib.load_tokenizer(tokenizer_name, c.model.cache_dir))
        cached = data_lib.tokenized_cache_path(raw, tokenizer, c.data.max_seq_length, self.cache_dir)
        engine.local_main_first(lambda: data_lib.tokenize_to_disk(raw, tokenizer, c.data.max_seq_length, cached))
        return tokenizer, data_lib.load_tokenized(cached)

    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight")
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = [
            {"params": [p for n, p in params if not n.endswith(no_decay)], "weight_decay": self.args.weight_decay},
            {"params": [p for n, p in params if n.endswith(no_decay)], "weight_decay": 0.0},
        ]
        lr = self.engine.effective_learning_rate(self.args.learning_rate)
        return torch.optim.AdamW(groups, lr=lr, eps=self.args.adam_epsilon)

    # ---- evaluation --------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, dataset, tokenizer) -> dict[str, Any]:
        """Every example once over all ranks (the shard follows the current world size)."""
        engine = self.engine
        args = self.args
        loader = data_lib.eval_loader(
            dataset, tokenizer, args.per_device_eval_batch_size, engine.world_size, engine.rank
        )
        net = engine.unwrap(model)
        net.eval()
        rows = [torch.zeros((0, 3), dtype=torch.int64)]
        for batch in loader:
            index = batch.pop("example_index")
            batch = {k: v.to(engine.device, non_blocking=True) for k, v in batch.items()}
            labels = batch.pop("labels")
            with self.precision.autocast():
                predictions = net(**batch).logits.argmax(dim=-1)
            rows.append(torch.stack([index, predictions.cpu(), labels.cpu()], dim=1))
        gathered = engine.all_gather(torch.cat(rows).to(engine.device))
        result = exact_accuracy(gathered.cpu(), len(dataset))
        per_rank = engine.all_gather(torch.tensor([result["accuracy"]], dtype=torch.float64, device=engine.device))
        result["accuracy_per_rank"] = per_rank.cpu().tolist()
        net.train()
        return result

    # ---- checkpoints ---------------------------------------------------------------------------
    def load_checkpoint(self, model: torch.nn.Module, compatibility: dict[str, Any]):
        """Rank 0 reads and verifies the checkpoint and broadcasts it; every rank raises the same error."""
        payload: Any = None
        if self.engine.is_main:
            try:
                path = ckpt.resolve_checkpoint(self.args.resume_from_checkpoint, self.output_dir)
                payload = ckpt.load_checkpoint(path)
                ckpt.check_compatible(payload[2]["compatibility"], compatibility, path)
            except UsageError as error:
                payload = error
        payload = self.engine.broadcast_object(payload)
        if isinstance(payload, UsageError):
            raise payload
        tensors, training_state, trainer_state = payload
        model.load_state_dict(tensors)
        self.log(f"resumed from step {trainer_state['global_step']} (epoch {trainer_state['epoch']})")
        return training_state, trainer_state

    # ---- the loop ----------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        args, engine, c = self.args, self.engine, self.config
        started = time.perf_counter()
        set_seed(args.seed)
        tokenizer, tokenized = self.prepare_data()
        label_names = LABEL_NAMES_3 if c.data.num_labels == 3 else [f"LABEL_{i}" for i in range(c.data.num_labels)]
        model = model_lib.build_model(
            c.model.model_name_or_path,
            c.data.num_labels,
            label_names,
            len(tokenizer),
            args.seed,
            dropout=args.dropout,
            cache_dir=c.model.cache_dir,
        )
        if args.torch_compile:
            model.compile()  # in place: state_dict keys and save_pretrained are unchanged
        optimizer = self.build_optimizer(model)
        compatibility = {
            "model_name_or_path": c.model.model_name_or_path,
            "num_labels": c.data.num_labels,
            "vocab_size": len(tokenizer),
            "architecture": type(model).__name__,
        }
        resumed = self.load_checkpoint(model, compatibility) if args.resume_from_checkpoint else None
        model, optimizer = engine.wrap(model, optimizer)
        if resumed:
            # After wrapping: Horovod's DistributedOptimizer is a new optimizer with empty state.
            optimizer.load_state_dict(resumed[0]["optimizer"])

        accum, batch_size = args.gradient_accumulation_steps, args.per_device_train_batch_size
        train_set = tokenized["train"]
        if args.audit_samples:
            train_set = train_set.add_column("example_index", list(range(len(train_set))))
        sampler = engine.train_sampler(train_set, args.seed)
        train_loader = data_lib.train_loader(
            train_set,
            tokenizer,
            batch_size,
            engine.world_size,
            engine.rank,
            args.seed,
            args.dataloader_num_workers,
            sampler=sampler,
            group_by_length=args.group_by_length,
            pin_memory=engine.device.type == "cuda",
        )
        steps_per_epoch = len(train_loader) // accum
        if steps_per_epoch == 0:
            raise UsageError(
                f"one optimizer step needs {accum} micro-batches per rank but a rank has {len(train_loader)}",
                "lower --gradient_accumulation_steps or --per_device_train_batch_size, or add data",
            )
        total_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * steps_per_epoch)
        num_epochs = math.ceil(total_steps / steps_per_epoch)

        def make_scheduler(total: int):
            warmup = args.warmup_steps or math.ceil(args.warmup_ratio * total)
            return get_linear_schedule_with_warmup(optimizer, warmup, total)

        scheduler = make_scheduler(total_steps)
        progress_fields = {"epoch": 0, "steps_in_epoch": 0, "global_step": 0, "history": (), "resizes": (),
                           "epoch_examples": (), "samples_in_epoch": 0, "total_steps": total_steps}
        if resumed:
            training_state, trainer_state = resumed
            scheduler.load_state_dict(training_state["scheduler"])
            self.precision.load_state_dict(training_state)
            progress_fields.update(
                global_step=trainer_state["global_step"],
                epoch=trainer_state["epoch"],
                steps_in_epoch=trainer_state["steps_in_epoch"],
            )

        # Every input has been validated: only now is anything written.
        if engine.is_main and not resumed and not (args.elastic and joins_running_job(args.output_dir)):
            reset_output_dir(args.output_dir)
            write_json_atomic(self.output_dir / "run_config.json",
                              {**c.to_dict(), **engine.describe(), "launch_id": launch_id()})
        self.log(
            f"engine={engine.name} world_size={engine.world_size} device={engine.device} "
            f"train={len(tokenized['train'])} validation={len(tokenized['validation'])} "
            f"global_batch={batch_size * accum * engine.world_size} steps={total_steps}"
        )
        if resumed:
            ckpt.set_rng_state(resumed[0]["rng"])

        # Under a launcher stderr is a pipe, not a terminal: redraw the bar rarely so logs stay readable.
        interactive = sys.stderr.isatty()
        progress = tqdm(total=total_steps, disable=not engine.is_main or args.disable_tqdm, desc="train",
                        mininterval=0.1 if interactive else 10.0, ascii=not interactive)

        def save(state) -> None:
            if engine.is_main and args.save_total_limit > 0:
                saved = ckpt.TrainerState(state.global_step, state.epoch, state.steps_in_epoch, compatibility,
                                          c.to_dict())
                ckpt.save_checkpoint(self.output_dir, engine.unwrap(model), optimizer, scheduler, saved,
                                     keep=args.save_total_limit, extra_state=self.precision.state_dict())

        def epochs_done(state) -> float:
            return state.epoch + min(1.0, state.samples_in_epoch / len(train_set))

        def finished(state) -> bool:
            if args.elastic and args.max_steps <= 0:
                # Steps per epoch change with the world size: an elastic run ends by epochs, not steps.
                return epochs_done(state) >= args.num_train_epochs
            return state.global_step >= state.total_steps

        def schedule_position(state) -> int:
            if args.elastic and args.max_steps <= 0:  # the LR follows the data seen, whatever the world size
                return round(state.total_steps * epochs_done(state) / args.num_train_epochs)
            return state.global_step

        def loop(state) -> dict[str, Any]:
            """Re-entrant: an elastic engine calls it again after a resize, from the last commit."""
            nonlocal scheduler
            if args.elastic:  # the schedule's length is rank 0's (a joining worker computed its own)
                scheduler = make_scheduler(state.total_steps)
            if not state.resizes or state.resizes[-1][1] != engine.world_size:
                state.resizes = (*state.resizes, (state.global_step, engine.world_size))
            base_lr = engine.effective_learning_rate(args.learning_rate)
            scheduler.base_lrs = [base_lr] * len(optimizer.param_groups)
            sync_learning_rate(scheduler, optimizer, schedule_position(state))
            progress.n = state.global_step
            meter, result = Meter(), None
            while state.epoch < num_epochs and not finished(state):
                sampler_ = train_loader.sampler
                sampler_.begin_epoch(state.epoch, state.steps_in_epoch * accum * batch_size)
                steps_left = len(train_loader) // accum
                batches = iter(train_loader)
                model.train()
                completed = True
                for _ in range(steps_left):
                    if finished(state):
                        completed = False
                        break
                    for micro in range(accum):
                        batch = next(batches)
                        if args.audit_samples:
                            seen = engine.all_gather(batch.pop("example_index").to(engine.device))
                            state.epoch_examples = (*state.epoch_examples, *seen.cpu().tolist())
                        batch = {k: v.to(engine.device, non_blocking=True) for k, v in batch.items()}
                        with engine.accumulation_context(model, is_last_micro_step=micro == accum - 1):
                            with self.precision.autocast():
                                loss = engine.forward_loss(model, batch)
                            self.precision.backward(loss / accum)
                        meter.add(loss.item(), batch)
                    engine.clip_and_step(model, optimizer, args.max_grad_norm, self.precision.scaler)
                    if args.elastic:
                        state.samples_in_epoch += accum * batch_size * engine.world_size
                        sync_learning_rate(scheduler, optimizer, schedule_position(state))
                    else:
                        scheduler.step()
                    optimizer.zero_grad()
                    sampler_.record_step(accum * batch_size)
                    state.global_step += 1
                    state.steps_in_epoch += 1
                    progress.update(1)
                    if state.global_step % args.logging_steps == 0 or finished(state):
                        record = {
                            "step": state.global_step,
                            "epoch": round(state.epoch + state.steps_in_epoch / max(steps_per_epoch, 1), 4),
                            "learning_rate": scheduler.get_last_lr()[0],
                            "world_size": engine.world_size,
                            **meter.reduce(engine),
                        }
                        meter = Meter()
                        self.append_metrics(record)
                        progress.set_postfix(loss=f"{record['loss']:.4f}")
                    if args.save_steps and state.global_step % args.save_steps == 0:
                        save(state)
                    if args.elastic and state.global_step % args.elastic_commit_steps == 0:
                        state.commit()
                result = self.evaluate(model, tokenized["validation"], tokenizer)
                entry = {"epoch": state.epoch + 1, "step": state.global_step, "accuracy": result["accuracy"]}
                if args.audit_samples and completed:
                    entry["samples"] = audit_epoch(state.epoch_examples, len(train_set))
                    state.epoch_examples = ()
                state.history = (*state.history, entry)
                self.log(
                    f"epoch {state.epoch + 1}/{num_epochs} step {state.global_step}: eval accuracy "
                    f"{result['accuracy']:.4f} on {result['eval_samples']} examples"
                )
                if completed:
                    state.epoch, state.steps_in_epoch, state.samples_in_epoch = state.epoch + 1, 0, 0
                save(state)
                state.commit()
            return result or self.evaluate(model, tokenized["validation"], tokenizer)

        state = engine.progress_state(model, optimizer, train_loader.sampler, **progress_fields)
        result = engine.run(loop, state)
        progress.close()

        checksums = engine.all_gather(
            torch.tensor([param_checksum(engine.unwrap(model))], dtype=torch.int64, device=engine.device)
        )
        peak_memory = torch.tensor([peak_memory_mb(engine.device)], dtype=torch.float64, device=engine.device)
        results = {
            **result,
            **engine.describe(),
            "epoch": num_epochs,
            "global_step": state.global_step,
            "history": list(state.history),
            "world_size_changes": [list(r) for r in state.resizes],
            "param_checksum_per_rank": checksums.cpu().tolist(),
            "peak_memory_mb_per_rank": engine.all_gather(peak_memory).cpu().tolist(),
            "wall_time_s": round(time.perf_counter() - started, 3),
        }
        if engine.is_main:
            engine.unwrap(model).save_pretrained(self.output_dir)
            tokenizer.save_pretrained(self.output_dir)
            write_json_atomic(self.output_dir / "eval_results.json", results)
        return results

    def append_metrics(self, record: dict[str, Any]) -> None:
        if self.engine.is_main:  # opened per record: after an elastic resize rank 0 may be a new process
            with (self.output_dir / "metrics.jsonl").open("a") as f:
                f.write(json.dumps(record) + "\n")


def audit_epoch(examples: tuple[int, ...], dataset_size: int) -> dict[str, int]:
    """How an epoch covered the training set: examples never seen and extra repetitions."""
    counts = collections.Counter(examples)
    return {
        "dataset": dataset_size,
        "trained_on": len(examples),
        "skipped": dataset_size - len(counts),
        "repeated": sum(n - 1 for n in counts.values()),
    }


def sync_learning_rate(scheduler, optimizer: torch.optim.Optimizer, global_step: int) -> None:
    """Put the schedule at ``global_step`` (after a resume, an elastic rollback or a change of base LR)."""
    scheduler.last_epoch = global_step
    lrs = [base * lam(global_step) for base, lam in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs
