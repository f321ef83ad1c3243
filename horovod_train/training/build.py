"""The builders setup() calls, in its order: each returns what it builds and sets nothing."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, DatasetDict
from torch.utils.data import DataLoader

from horovod_train.common.errors import UsageError
from horovod_train.config.domains import ADAMW_FUSED
from horovod_train.config.run_config import DataArguments, RunConfig, TrainingArguments
from horovod_train.data.columns import text_columns
from horovod_train.data.labels import label_names, same_names, shape_of
from horovod_train.data.loaders import BatchWidths, example_lengths, train_loader
from horovod_train.data.splits import load_raw_datasets
from horovod_train.data.tokenize import (
    dataset_digest,
    load_tokenized,
    tokenize_to_disk,
    tokenized_cache_path,
    tokenizer_digest,
)
from horovod_train.engines.base import Engine
from horovod_train.engines.specs import spec_of
from horovod_train.models import lora
from horovod_train.models import model as model_lib
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.training import peak_memory
from horovod_train.training.evaluation import eval_prefixes, task_shape
from horovod_train.training.parts import RunPlan
from horovod_train.training.position import TrainingPosition
from horovod_train.training.rank_zero import RankZero


def trained_labels(config: RunConfig) -> tuple[str, ...] | None:
    """The label names the pretrained classifier was trained with (models/model.trained_label_names), read once a
    run: the data's labels take their order (prepare_data), and a warning names other ones (warn_of_other_labels)."""
    return model_lib.trained_label_names(config.model, hub_access(config))


def prepare_data(
    config: RunConfig, engine: Engine, cache_dir: Path, rank_zero: RankZero, model_labels: tuple[str, ...] | None
) -> tuple[Any, DatasetDict]:
    """The tokenizer and the tokenized splits, through the tokenization cache (each node's local rank 0
    fills it first; ``rank_zero`` does rank 0's work before any other rank's); the labels in ``model_labels``' order
    where they are the same names (trained_labels)."""
    c = config
    raw = read_raw_data(config, engine, model_labels)
    tokenizer_name = c.model.tokenizer_name or c.model.model_name_or_path
    if tokenizer_name == model_lib.TINY_BERT:
        # [:] reads a column as one list; iterating the Column reads it a row at a time (0.5 s for 7200 rows).
        texts = [t for column in text_columns(raw) for t in raw["train"][column][:]]
        tokenizer_dir = model_lib.tiny_tokenizer_dir(cache_dir, texts)
        # One tokenizer for the job, rank 0's: training one is not deterministic.
        files = rank_zero.read_in_setup(lambda: model_lib.tiny_tokenizer_files(tokenizer_dir, texts))
        engine.local_main_first(lambda: model_lib.install_tokenizer_files(tokenizer_dir, files))
        tokenizer_name = str(tokenizer_dir)
    access = hub_access(c)
    tokenizer = engine.local_main_first(lambda: model_lib.load_tokenizer(tokenizer_name, c.model.cache_dir, access))
    d = c.data
    cached = tokenized_cache_path(raw, tokenizer, d.max_seq_length, cache_dir, d.pad_to_max_length)

    def tokenize(overwrite: bool = False) -> None:
        tokenize_to_disk(
            raw,
            tokenizer,
            d.max_seq_length,
            cached,
            d.pad_to_max_length,
            overwrite,
            num_proc=d.preprocessing_num_workers,
        )

    if d.overwrite_cache:  # rebuilt once, by rank 0, before any rank maps it (the cache may be shared by nodes)
        rank_zero.first(lambda: tokenize(overwrite=True))
    engine.local_main_first(tokenize)
    return tokenizer, load_tokenized(cached)


def check_task_shape(args: TrainingArguments, tokenized: DatasetDict, task_name: str | None) -> None:
    """Options the data's shape rules out: label smoothing is for a shape that smooths labels alone
    (single-label classification)."""
    shape = task_shape(tokenized, task_name)
    if args.label_smoothing_factor and not shape.smooths_labels:
        raise UsageError(f"--label_smoothing_factor smooths class labels but this run is a {shape.name}",
                         "drop --label_smoothing_factor")  # fmt: skip
    check_metric_for_best_model(args.metric_for_best_model, tokenized, task_name)


def read_raw_data(config: RunConfig, engine: Engine, model_labels: tuple[str, ...] | None) -> DatasetDict:
    """The raw splits; each node's local main rank reads first (it builds the data files' Arrow cache, which the
    other ranks then map). Bad data is refused by every rank alike: the local main rank reaches the barrier."""
    c = config

    def read() -> DatasetDict | UsageError:
        try:
            return load_raw_datasets(c.data, c.training.seed, c.model.cache_dir, model_labels)
        except UsageError as refused:
            return refused

    raw = engine.local_main_first(read)
    if isinstance(raw, UsageError):
        raise raw
    return raw


def check_metric_for_best_model(metric: str | None, tokenized: DatasetDict, task_name: str | None = None) -> None:
    if metric is None:
        return
    names = ("loss", *task_shape(tokenized, task_name).metric_names())
    known = [f"{prefix}_{m}" for prefix in eval_prefixes(tokenized).values() for m in names]
    if metric not in known:
        raise UsageError(
            f"--metric_for_best_model {metric} is not a metric of this run", f"use one of {', '.join(known)}"
        )


def build_model(config: RunConfig, tokenizer: Any, tokenized: DatasetDict, on_meta: bool = False) -> torch.nn.Module:
    """``on_meta``: the model's shape alone, on the meta device (model_lib.build_model)."""
    c, args = config, config.training
    names = label_names(tokenized)  # checked against --num_labels when the data loaded
    model = model_lib.build_model(
        c.model.model_name_or_path,
        len(names),
        names,
        len(tokenizer),
        args.seed,
        dropout=args.dropout,
        cache_dir=c.model.cache_dir,
        config_name=c.model.config_name,
        pad_token_id=tokenizer.pad_token_id,
        access=hub_access(c),
        shape=shape_of(tokenized),
        on_meta=on_meta,
    )
    return finish_model(model, config)


def warn_of_other_labels(
    config: RunConfig, trained: tuple[str, ...] | None, tokenized: DatasetDict, warn: Callable[[str], None]
) -> None:
    """run_glue.py's warning where a pretrained classifier was trained for other labels than the data's (the same
    names take its order: data/labels.in_model_order): a head of another size is trained anew (transformers
    re-initializes it), one of the same size has its rows renamed. Silent, a user who brought the wrong model or
    label column lost its trained head without a word."""
    names = label_names(tokenized)
    if trained is None or same_names(trained, names):
        return
    what = "its classification head is trained anew" if len(trained) != len(names) else \
        "its head's rows are renamed in that order"  # fmt: skip
    warn(f"warning: {config.model.model_name_or_path} was trained for the labels {', '.join(trained)} but the "
         f"train data's are {', '.join(names)}: {what}")  # fmt: skip


def finish_model(model: torch.nn.Module, config: RunConfig) -> torch.nn.Module:
    """The built model as the run trains it: its attention, padding-free batches, gradient checkpointing, LoRA and
    torch.compile as the arguments ask (`bench gpu` finishes its models here too, so that it times train's)."""
    c, args = config, config.training
    if c.model.attn_implementation:
        set_attention(model, c.model.attn_implementation)
    if args.padding_free:
        model_lib.enable_padding_free(model)
    if args.gradient_checkpointing:
        model_lib.enable_gradient_checkpointing(model)
    if c.model.use_peft:
        model = lora.wrap(model, lora_options(c.model))
    if args.torch_compile:  # in place: state_dict keys and save_pretrained are unchanged
        # With --length_buckets a graph per bucket, each specialised to its length (CUDA graphs are recorded
        # per shape anyway); else torch's default, which recompiles once for shapes that vary (dynamic shapes).
        dynamic = False if c.data.length_buckets else None
        model.compile(backend=args.torch_compile_backend or "inductor", mode=args.torch_compile_mode, dynamic=dynamic)
    return model


def set_attention(model: torch.nn.Module, name: str) -> None:
    """transformers' attn_implementation, refused in one line where the model or the machine lacks it."""
    try:
        model.set_attn_implementation(name)
    except (ImportError, ValueError) as refused:
        reason = str(refused).strip().splitlines()[0]
        raise UsageError(f"--attn_implementation {name}: {reason}",
                         "use --attn_implementation sdpa (or eager), or drop it") from None  # fmt: skip


def check_memory(config: RunConfig, engine: Engine, tokenizer: Any, tokenized: DatasetDict) -> None:
    """Refuse a run whose peak (the engines' memory model, its row's ``memory``: the process, the training state as
    the engine spreads it, the activations, a save's gather, a save's copy with --save_async) cannot fit the memory
    free now, counted on the model's shape before any rank builds it."""
    shape = build_model(config, tokenizer, tokenized, on_meta=True)
    params = sum(p.numel() for p in shape.parameters())
    trainable = sum(p.numel() for p in shape.parameters() if p.requires_grad)
    args = config.training
    activations = peak_memory.activation_bytes(
        shape.config, args.per_device_train_batch_size, config.data.max_seq_length, args.gradient_checkpointing
    )
    largest = peak_memory.largest_tensor(shape)
    parts = spec_of(engine.name).memory.peak_bytes(
        params, trainable, engine.world_size, activations, engine.replicate_degree, largest, args.save_async
    )
    ranks = engine.local_world_size if engine.device.type == "cpu" else 1
    peak_memory.check_peak_fits(engine.name, params, parts, ranks, engine.device)


def lora_options(model_args: Any) -> lora.LoraOptions:
    targets = model_args.lora_target_modules
    return lora.LoraOptions(
        r=model_args.lora_r,
        alpha=model_args.lora_alpha,
        dropout=model_args.lora_dropout,
        target_modules=tuple(t.strip() for t in targets.split(",") if t.strip()) if targets else None,
    )


def run_compatibility(
    config: RunConfig, engine: Engine, tokenizer: Any, tokenized: DatasetDict, model: torch.nn.Module
) -> ckpt.Compatibility:
    """What a checkpoint must agree with: the model (LoRA's settings too), and what fixes the examples each step
    trains on (the tokenized training set, the seed and sampler that order it, the global batch)."""
    args = config.training
    names = label_names(tokenized)
    return ckpt.Compatibility(
        config.model.model_name_or_path,
        len(names),
        len(tokenizer),
        type(model).__name__,
        engine.step_examples(args.per_device_train_batch_size * args.gradient_accumulation_steps),
        tokenizer=tokenizer_digest(tokenizer),
        label_names=list(names),
        train_data=dataset_digest(tokenized["train"]),
        seed=args.seed,
        group_by_length=args.group_by_length,
        **lora.settings(model),
    )


def decay_groups(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    """The names of the trainable parameters with weight decay and without, each in ``named_parameters`` order: the
    optimizer's two groups, whose concatenation numbers its state (checkpoint_trainer re-keys it by these names)."""
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight")
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return [n for n in names if not n.endswith(no_decay)], [n for n in names if n.endswith(no_decay)]


def build_optimizer(args: TrainingArguments, engine: Engine, model: torch.nn.Module) -> torch.optim.Optimizer:
    params = dict(model.named_parameters())
    decay, no_decay = decay_groups(model)
    groups = [
        {"params": [params[n] for n in decay], "weight_decay": args.weight_decay},
        {"params": [params[n] for n in no_decay], "weight_decay": 0.0},
    ]
    lr = engine.effective_learning_rate(args.learning_rate)
    betas = (args.adam_beta1, args.adam_beta2)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=args.adam_epsilon, fused=ADAMW_FUSED[args.optim])


def build_train_set(tokenized: DatasetDict, audit_samples: bool) -> Dataset:
    """The training split; with --audit_samples each example carries its index."""
    train_set = tokenized["train"]
    if audit_samples:
        train_set = train_set.add_column("example_index", list(range(len(train_set))))
    return train_set


def batch_widths(train_set: Dataset, args: TrainingArguments, data: DataArguments) -> BatchWidths | None:
    """The lengths every batch is padded to (--length_buckets, --pad_to_multiple_of), the training data's; the
    evaluation's batches too (a compiled model compiles once per shape, in evaluation as in training)."""
    if not (data.length_buckets or data.pad_to_multiple_of):
        return None
    lengths = example_lengths(train_set) if data.length_buckets else []
    # Grouped by length, a batch's examples are alike: its longest is an example's length.
    batch = 1 if args.group_by_length else args.per_device_train_batch_size
    return BatchWidths.of(lengths, data.length_buckets, data.pad_to_multiple_of, batch)


def build_train_loader(
    train_set: Dataset, tokenizer: Any, args: TrainingArguments, engine: Engine, widths: BatchWidths | None
) -> DataLoader:
    return train_loader(
        train_set,
        tokenizer,
        args.per_device_train_batch_size,
        engine.world_size,
        engine.rank,
        args.seed,
        args.dataloader_num_workers,
        sampler=engine.train_sampler(train_set, args.seed),
        group_by_length=args.group_by_length,
        pin_memory=engine.device.type == "cuda",
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        widths=widths,
        padding_free=args.padding_free,
    )


def plan_run(args: TrainingArguments, micro_batches: int, world_size: int) -> RunPlan:
    """The run's length from this world's steps per epoch (``micro_batches``: a rank's per epoch)."""
    accum = args.gradient_accumulation_steps
    steps_per_epoch = micro_batches // accum
    if steps_per_epoch == 0:
        raise UsageError(
            f"one optimizer step needs {accum} micro-batches per rank but a rank has {micro_batches}",
            "lower --gradient_accumulation_steps or --per_device_train_batch_size, or add data",
        )
    max_steps, epochs = args.max_steps, args.num_train_epochs
    total_steps = max_steps if max_steps > 0 else math.ceil(epochs * steps_per_epoch)
    return RunPlan(
        steps_per_epoch=steps_per_epoch,
        num_epochs=math.ceil(total_steps / steps_per_epoch),
        total_steps=total_steps,
        global_batch=args.per_device_train_batch_size * accum * world_size,
        intervals=args.step_intervals(total_steps),
    )


def start_position(resumed: dict[str, Any] | None, plan: RunPlan) -> TrainingPosition:
    """Where a checkpoint left off, or the beginning; the schedule's length is this run's plan."""
    saved = resumed["trainer_state"] if resumed else {}
    return TrainingPosition.from_dict({**saved, "total_steps": plan.total_steps})


def hub_access(c: RunConfig) -> model_lib.HubAccess:
    return model_lib.HubAccess(c.model.model_revision, c.model.token, c.model.trust_remote_code)
