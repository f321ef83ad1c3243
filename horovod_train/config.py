"""Run configuration: dataclasses in the style of transformers' run_glue.py, a CLI built from them,
and an optional YAML/JSON ``--config`` whose keys are the same names (the CLI overrides it).

Each dataclass is a section of ``--help``. The engine-only sections (Horovod, DDP) are read by their
engine alone; the flags keep one flat namespace, so a config file needs no section headers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from horovod_train import glue  # datasets-free: config stays light to import
from horovod_train.errors import UsageError
from horovod_train.schedule import SCHEDULES
from horovod_train.stopping import parse_signals
from horovod_train.trackers import check_report_to

EVAL_STRATEGIES = SAVE_STRATEGIES = ("epoch", "steps", "no")
PACKAGED_CONFIGS = "configs"  # horovod_train/configs/<name>.yaml, found by name after any install


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        default="tiny-bert",
        metadata={"help": "Hub name or local directory, or 'tiny-bert' (random init, tokenizer trained locally)."},
    )
    config_name: str | None = field(
        default=None,
        metadata={
            "help": "Config name or directory if not the model's (as in run_glue.py); with tiny-bert, the "
            "architecture to random-init (e.g. a bert-base-cased config.json's directory)."
        },
    )
    tokenizer_name: str | None = field(default=None, metadata={"help": "Defaults to model_name_or_path."})
    cache_dir: str | None = field(
        default=None, metadata={"help": "Where tokenized data and trained tokenizers are cached."}
    )


@dataclass
class DataArguments:
    task_name: str | None = field(
        default=None,
        metadata={
            "help": "GLUE task (cola, mnli, mrpc, qnli, qqp, rte, sst2, wnli): its text columns and label names; "
            "without --train_file or another --dataset_name it loads nyu-mll/glue (network needed)."
        },
    )
    dataset_name: str | None = field(
        default="synthetic-nli",
        metadata={
            "help": "Hub dataset (e.g. multi_nli), a directory written by save_to_disk, or 'synthetic-nli'. "
            "Ignored when --train_file is set."
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The hub dataset's configuration."})
    train_file: str | None = field(default=None, metadata={"help": "csv, tsv, json or jsonl file."})
    validation_file: str | None = field(default=None, metadata={"help": "csv, tsv, json or jsonl file."})
    test_file: str | None = field(
        default=None, metadata={"help": "csv, tsv, json or jsonl file to predict on (the test split); labels optional."}
    )
    text_column_names: str | None = field(
        default=None,
        metadata={
            "help": "One or two text columns, comma-separated (default: the task's, else premise,hypothesis, "
            "sentence1,sentence2, sentence or text)."
        },
    )
    label_column_name: str = field(default="label", metadata={"help": "The label column (integers or strings)."})
    validation_split_name: str | None = field(
        default=None,
        metadata={
            "help": "The one split of a hub or save_to_disk dataset to validate on (e.g. validation_matched; "
            "default: a task's or a directory's validation splits, else a part of train held out)."
        },
    )
    validation_split_percentage: int = field(
        default=10, metadata={"help": "Held out of train when there is no validation file/split."}
    )
    max_seq_length: int = field(
        default=128, metadata={"help": "Truncate texts to this many tokens (padding is dynamic, per batch)."}
    )
    pad_to_max_length: bool = field(
        default=False, metadata={"help": "Pad every example to --max_seq_length (else each batch to its longest)."}
    )
    overwrite_cache: bool = field(
        default=False, metadata={"help": "Tokenize again instead of reading the cached tokenized data."}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Train on the first N training examples only."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "At most N examples of each validation split."}
    )
    synthetic_num_examples: int = field(
        default=8000, metadata={"help": "Size of the generated synthetic-nli set (before the split)."}
    )
    num_labels: int | None = field(
        default=None, metadata={"help": "Number of labels (default: inferred from the data's label names or labels)."}
    )

    def text_columns(self) -> list[str] | None:
        return [name.strip() for name in self.text_column_names.split(",")] if self.text_column_names else None

    def check(self) -> None:
        glue.check_task(self.task_name)
        columns = self.text_columns()
        if columns is not None and (not 1 <= len(columns) <= 2 or not all(columns)):
            raise UsageError(
                f"--text_column_names takes one or two column names (got {self.text_column_names!r})",
                "pass e.g. --text_column_names sentence or --text_column_names sentence1,sentence2",
            )
        if not self.label_column_name.strip():
            raise UsageError("--label_column_name is empty", "pass the label column's name (default: label)")
        if self.num_labels is not None and self.num_labels < 2:
            raise UsageError(f"--num_labels must be >= 2 (got {self.num_labels})", "drop it to infer it from the data")


@dataclass
class TrainingArguments:
    output_dir: str = field(
        default="runs/train", metadata={"help": "Where the model, results, logs and checkpoints go."}
    )
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Replace an earlier run in --output_dir."})
    engine: str = field(default="horovod", metadata={"help": "Data-parallel engine: horovod, ddp, dp or single."})
    per_device_train_batch_size: int = field(default=32, metadata={"help": "Examples per rank per micro-step."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Examples per rank per evaluation batch."})
    learning_rate: float = field(default=5e-5, metadata={"help": "AdamW's peak learning rate (after warmup)."})
    weight_decay: float = field(
        default=0.0, metadata={"help": "AdamW's weight decay (not on biases and LayerNorm weights)."}
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW's beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW's beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW's epsilon."})
    num_train_epochs: float = field(default=3.0, metadata={"help": "Epochs to train (fractions allowed)."})
    max_steps: int = field(default=-1, metadata={"help": "If > 0, overrides num_train_epochs."})
    lr_scheduler_type: str = field(
        default="linear", metadata={"help": f"Learning-rate schedule after the warmup: {', '.join(SCHEDULES)}."}
    )
    warmup_ratio: float = field(
        default=0.0, metadata={"help": "Warmup as a share of the steps (when --warmup_steps is 0)."}
    )
    warmup_steps: int = field(default=0, metadata={"help": "Linear warmup steps."})
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Micro-steps per optimizer step (Horovod's backward_passes_per_step)."}
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "0 disables clipping."})
    label_smoothing_factor: float = field(
        default=0.0, metadata={"help": "Label smoothing epsilon in the training and eval loss (0: off)."}
    )
    seed: int = field(default=42, metadata={"help": "Seed of the model init, the data order and synthetic-nli."})
    logging_steps: int = field(default=50, metadata={"help": "Log the training loss every N steps."})
    eval_strategy: str = field(
        default="epoch", metadata={"help": "When to evaluate during training: epoch, steps (every --eval_steps) or no."}
    )
    eval_steps: int | None = field(
        default=None, metadata={"help": "With --eval_strategy steps: evaluate every N steps (default: logging_steps)."}
    )
    do_train: bool = field(default=True, metadata={"help": "Accepted for run_glue.py command lines: a run trains."})
    do_eval: bool = field(
        default=True, metadata={"help": "Accepted for run_glue.py command lines: a run ends with an evaluation."}
    )
    do_predict: bool = field(
        default=False, metadata={"help": "Write predict_results.txt for the test split (--test_file) after training."}
    )
    dropout: float | None = field(default=None, metadata={"help": "Override the model's dropout (0 = off)."})
    dataloader_num_workers: int = field(default=0, metadata={"help": "Data loader worker processes per rank."})
    disable_tqdm: bool = field(
        default=False, metadata={"help": "No progress bar on a terminal either (log lines instead)."}
    )
    report_to: str = field(
        default="none",
        metadata={"help": "Trackers fed from rank 0, comma-separated: tensorboard, wandb, mlflow, all or none."},
    )
    run_name: str | None = field(
        default=None, metadata={"help": "The run's name in the trackers (default: the output_dir's name)."}
    )
    # Checkpoints.
    load_best_model_at_end: bool = field(
        default=False,
        metadata={"help": "Keep the checkpoint with the best --metric_for_best_model (rotation spares it) and end "
                  "the run with its weights; needs --save_strategy equal to --eval_strategy."},
    )
    metric_for_best_model: str | None = field(
        default=None,
        metadata={"help": "What makes a checkpoint best: loss, accuracy, f1, or <split>_<metric> for another "
                  "validation split, with or without eval_ (default: loss with --load_best_model_at_end)."},
    )
    greater_is_better: bool | None = field(
        default=None, metadata={"help": "Whether a larger metric is better (default: false for a loss, else true)."}
    )
    save_strategy: str = field(
        default="epoch",
        metadata={"help": "epoch: checkpoint at epoch ends (and every --save_steps if > 0); steps: every --save_steps "
                  "and at the end; no: only when a stop signal arrives."},
    )
    save_steps: int = field(default=0, metadata={"help": "Checkpoint every N steps (0: none between epoch ends)."})
    save_total_limit: int | None = field(
        default=2, metadata={"help": "Newest checkpoints of the run kept (None: all, as in transformers)."}
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "A checkpoint-<step> directory; 'latest': the newest valid one in --output_dir; 'auto': that, "
            "or start fresh when there is none (a requeued job)."
        },
    )
    checkpoint_signals: str = field(
        default="SIGTERM,SIGUSR1",
        metadata={"help": "Signals that checkpoint and stop the run at the next step, exit code 75 ('none': off)."},
    )
    ddp_timeout: int = field(
        default=1800,
        metadata={"help": "Seconds a collective may wait for a rank (DDP's process group; Horovod's stall shutdown)."},
    )
    audit_samples: bool = field(
        default=False, metadata={"help": "Record which examples each epoch trained on (one all-gather a step)."}
    )
    # Speed (docs/performance.md). Defaults keep fp32 results bit-identical.
    bf16: bool = field(default=False, metadata={"help": "bfloat16 autocast (CPU or GPU)."})
    fp16: bool = field(default=False, metadata={"help": "float16 autocast with a GradScaler (CUDA only)."})
    tf32: bool = field(default=False, metadata={"help": "TF32 matmuls for float32 on CUDA."})
    torch_compile: bool = field(default=False, metadata={"help": "torch.compile the model (in place)."})
    group_by_length: bool = field(default=False, metadata={"help": "Batch examples of similar length (less padding)."})


@dataclass
class HorovodArguments:
    """Read by --engine horovod only."""

    scale_lr: bool = field(default=False, metadata={"help": "Multiply the learning rate by the world size."})
    compression: str = field(default="none", metadata={"help": "Gradient compression: none or fp16."})
    op: str = field(default="average", metadata={"help": "Gradient reduction: average or adasum."})
    gradient_predivide_factor: float = field(
        default=1.0, metadata={"help": "Divide gradients by this before the sum and by size/this after it."}
    )
    # Not --timeline: horovodrun's parser would reject it as an ambiguous prefix of its own --timeline-* options.
    horovod_timeline: str | None = field(default=None, metadata={"help": "Horovod timeline (HOROVOD_TIMELINE)."})
    autotune: bool = field(default=False, metadata={"help": "Horovod autotuning (HOROVOD_AUTOTUNE=1)."})
    autotune_log: str | None = field(default=None, metadata={"help": "Horovod autotune log (HOROVOD_AUTOTUNE_LOG)."})
    horovod_groups: int | None = field(
        default=None, metadata={"help": "hvd.DistributedOptimizer gradient groups (0: per tensor; default 1 on CPU)."}
    )
    # Elastic Horovod (horovodrun --min-np/--max-np --host-discovery-script).
    elastic: bool = field(default=False, metadata={"help": "Survive workers leaving and joining (Horovod)."})
    elastic_commit_steps: int = field(default=10, metadata={"help": "Steps between elastic state commits."})


@dataclass
class DDPArguments:
    """Read by --engine ddp only."""

    ddp_bucket_cap_mb: int = field(default=25, metadata={"help": "DDP gradient bucket size in MiB."})
    ddp_backend: str = field(default="auto", metadata={"help": "auto (NCCL on GPUs, else Gloo), nccl or gloo."})
    ddp_find_unused_parameters: bool = field(
        default=False, metadata={"help": "Let DDP find parameters that get no gradient (slower; some models need it)."}
    )


@dataclass
class RunConfig:
    model: ModelArguments = field(default_factory=ModelArguments)
    data: DataArguments = field(default_factory=DataArguments)
    training: TrainingArguments = field(default_factory=TrainingArguments)
    horovod: HorovodArguments = field(default_factory=HorovodArguments)
    ddp: DDPArguments = field(default_factory=DDPArguments)

    def to_dict(self) -> dict[str, Any]:
        """Every argument by its flag name (the sections share one namespace)."""
        return {k: v for f in dataclasses.fields(self) for k, v in dataclasses.asdict(getattr(self, f.name)).items()}


SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(RunConfig)}
SECTION_TITLES = {"model": "model", "data": "data", "training": "training", "horovod": "--engine horovod",
                  "ddp": "--engine ddp"}  # fmt: skip


class Parser(argparse.ArgumentParser):
    """argparse with the project's error style: one line and exit 2, not a usage dump."""

    def error(self, message: str) -> None:
        raise UsageError(message, f"see `{self.prog} --help`")


def _all_fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for cls in SECTIONS.values() for f in dataclasses.fields(cls)}


TRUE_VALUES, FALSE_VALUES = ("yes", "true", "t", "y", "1"), ("no", "false", "f", "n", "0")


def str_to_bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    lowered = value.lower()
    if lowered in TRUE_VALUES:
        return True
    if lowered in FALSE_VALUES:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {value!r}")


class _ExplicitNone:
    """`--flag None` on the command line: unlike an absent flag (argparse's None), it overrides a config file."""

    def __repr__(self) -> str:
        return "None"


EXPLICIT_NONE = _ExplicitNone()


def _optional(kind: type):
    def parse(value: str):
        return EXPLICIT_NONE if value.lower() in ("none", "null") else kind(value)

    parse.__name__ = kind.__name__
    return parse


def _field_type(f: dataclasses.Field) -> tuple[type, bool]:
    """(base type, optional?) from the string annotations of the dataclasses above."""
    annotation = str(f.type)
    optional = "None" in annotation
    base = annotation.replace("| None", "").strip()
    return {"str": str, "int": int, "float": float, "bool": bool}[base], optional


def _help(f: dataclasses.Field) -> str:
    """The field's help with its choices and default, as ``--help`` shows them (% escaped for argparse)."""
    text = f.metadata["help"]
    if "choices" in f.metadata:
        text += f" Choices: {', '.join(f.metadata['choices'])}."
    return f"{text} (default: {f.default})".replace("%", "%%")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML or JSON file (or a packaged config name: demo) of the arguments below.")
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"{SECTION_TITLES[section]} arguments")
        for f in dataclasses.fields(cls):
            kind, optional = _field_type(f)
            help_text = _help(f)
            if kind is bool:
                group.add_argument(f"--{f.name}", type=str_to_bool, nargs="?", const=True, help=help_text,
                                   metavar="BOOL")  # fmt: skip
                if f.default is True:  # HfArgumentParser's spelling of false for a flag that defaults to true
                    group.add_argument(f"--no_{f.name}", dest=f.name, action="store_const", const=False,
                                       help=f"The same as --{f.name} false. (default: not given)")  # fmt: skip
            else:
                group.add_argument(f"--{f.name}", type=_optional(kind) if optional else kind, help=help_text,
                                   metavar=kind.__name__.upper())  # fmt: skip
    parser.set_defaults(**{name: None for name in _all_fields()})


def config_path(spec: str) -> Path:
    """A config file by path, else by the name of one shipped in the package (``demo``)."""
    path = Path(spec)
    if path.is_file():
        return path
    packaged = resources.files("horovod_train") / PACKAGED_CONFIGS / f"{spec}.yaml"
    if packaged.is_file():
        return Path(str(packaged))
    raise UsageError(f"config file {spec} does not exist", "pass an existing YAML/JSON file (or 'demo') to --config")


def load_config_file(spec: str) -> dict[str, Any]:
    config_file = config_path(spec)
    text = config_file.read_text()
    try:
        data = json.loads(text) if config_file.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        first_line = str(exc).splitlines()[0]
        raise UsageError(f"config file {spec} is malformed ({first_line})", "fix its syntax") from None
    data = data or {}
    if not isinstance(data, dict):
        raise UsageError(f"config file {spec} is not a mapping of argument names", "write `name: value` lines")
    unknown = sorted(set(data) - set(_all_fields()))
    if unknown:
        raise UsageError(
            f"unknown key(s) in {spec}: {', '.join(unknown)}",
            "use argument names from `horovod-train train --help`",
        )
    return data


def _coerce(name: str, value: Any) -> Any:
    kind, optional = _field_type(_all_fields()[name])
    if value is None:
        if optional:
            return None
        raise UsageError(f"{name} must not be null", f"give {name} a value or drop it")
    try:
        if kind is bool:
            return str_to_bool(value if isinstance(value, bool) else str(value))
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return kind(value)
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        raise UsageError(
            f"{name}={value!r} is not a valid {kind.__name__}", f"set {name} to a {kind.__name__}"
        ) from None


def train_parser(prog: str = "horovod-train train") -> Parser:
    parser = Parser(prog=prog, description="Fine-tune a sequence-classification model data-parallel.")
    add_run_arguments(parser)
    return parser


def parse_run_config(argv: list[str] | None = None, namespace: argparse.Namespace | None = None) -> RunConfig:
    """Defaults < --config file < command line."""
    args = train_parser().parse_args(argv or []) if namespace is None else namespace
    values: dict[str, Any] = {}
    if args.config:
        values.update({k: _coerce(k, v) for k, v in load_config_file(args.config).items()})
    given = {k: v for k, v in vars(args).items() if k in _all_fields() and v is not None}
    values.update({k: None if v is EXPLICIT_NONE else v for k, v in given.items()})
    sections = {
        section: cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})
        for section, cls in SECTIONS.items()
    }
    config = RunConfig(**sections)
    validate(config)
    return config


def validate(config: RunConfig) -> None:
    _validate_sizes(config)
    _validate_training(config.training)
    _validate_horovod(config.horovod, config.training)
    if config.ddp.ddp_backend not in ("auto", "nccl", "gloo"):
        raise UsageError(f"unknown --ddp_backend {config.ddp.ddp_backend!r}", "use auto, nccl or gloo")


def _validate_sizes(config: RunConfig) -> None:
    t, d = config.training, config.data
    positive = {
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "per_device_eval_batch_size": t.per_device_eval_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "max_seq_length": d.max_seq_length,
        "synthetic_num_examples": d.synthetic_num_examples,
        "logging_steps": t.logging_steps,
    }
    for name, value in positive.items():
        if value <= 0:
            raise UsageError(f"--{name} must be > 0 (got {value})", f"pass --{name} 1 or more")
    if not 0 < d.validation_split_percentage < 100:
        raise UsageError(
            f"--validation_split_percentage must be in 1..99 (got {d.validation_split_percentage})",
            "pass e.g. 10",
        )
    d.check()


def _validate_training(t: TrainingArguments) -> None:
    if t.save_steps < 0:
        raise UsageError(f"--save_steps must be >= 0 (got {t.save_steps})", "pass --save_steps 0 or more")
    if t.save_total_limit is not None and t.save_total_limit <= 0:
        raise UsageError(f"--save_total_limit must be >= 1 or None (got {t.save_total_limit})",
                         "pass --save_strategy no to write no checkpoints, or None to keep them all")
    if t.save_strategy not in SAVE_STRATEGIES:
        raise UsageError(f"unknown --save_strategy {t.save_strategy!r}", f"use {', '.join(SAVE_STRATEGIES)}")
    if t.save_strategy == "steps" and not t.save_steps:
        raise UsageError("--save_strategy steps needs --save_steps", "pass e.g. --save_steps 500")
    if t.learning_rate <= 0:
        raise UsageError(f"--learning_rate must be > 0 (got {t.learning_rate})", "pass e.g. --learning_rate 5e-5")
    if t.max_steps <= 0 and t.num_train_epochs <= 0:
        raise UsageError("nothing to train: --num_train_epochs <= 0 and no --max_steps", "set one of them > 0")
    if t.dropout is not None and not 0.0 <= t.dropout < 1.0:
        raise UsageError(f"--dropout must be in [0, 1) (got {t.dropout})", "pass e.g. --dropout 0.1")
    if not (t.do_train and t.do_eval):
        flag = "--do_train" if not t.do_train else "--do_eval"
        raise UsageError(f"{flag} false: `train` always trains and evaluates",
                         "drop the flag (--eval_strategy no evaluates only once, at the end)")
    if t.lr_scheduler_type not in SCHEDULES:
        raise UsageError(f"unknown --lr_scheduler_type {t.lr_scheduler_type!r}", f"use {', '.join(SCHEDULES)}")
    if t.eval_strategy not in EVAL_STRATEGIES:
        raise UsageError(f"unknown --eval_strategy {t.eval_strategy!r}", f"use {', '.join(EVAL_STRATEGIES)}")
    if t.eval_steps is not None and t.eval_steps <= 0:
        raise UsageError(f"--eval_steps must be > 0 (got {t.eval_steps})", "pass e.g. --eval_steps 500")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(t, name) < 1.0:
            raise UsageError(f"--{name} must be in [0, 1) (got {getattr(t, name)})", f"pass e.g. --{name} 0.9")
    if not 0.0 <= t.label_smoothing_factor < 1.0:
        raise UsageError(f"--label_smoothing_factor must be in [0, 1) (got {t.label_smoothing_factor})",
                         "pass e.g. --label_smoothing_factor 0.1")
    _validate_best_model(t)
    if t.bf16 and t.fp16:
        raise UsageError("--bf16 and --fp16 are both set", "choose one of them")
    if t.ddp_timeout <= 0:
        raise UsageError(f"--ddp_timeout must be > 0 seconds (got {t.ddp_timeout})", "pass e.g. --ddp_timeout 1800")
    check_report_to(t.report_to)
    try:
        parse_signals(t.checkpoint_signals)
    except KeyError as unknown:
        raise UsageError(f"--checkpoint_signals: unknown signal {unknown}", "pass e.g. SIGTERM,SIGUSR1") from None


def _validate_best_model(t: TrainingArguments) -> None:
    """transformers' rules: the best checkpoint is chosen among checkpoints written right after an evaluation."""
    if t.metric_for_best_model is None and t.load_best_model_at_end:
        t.metric_for_best_model = "loss"
    if t.metric_for_best_model is not None:
        if not t.metric_for_best_model.startswith("eval_"):
            t.metric_for_best_model = f"eval_{t.metric_for_best_model}"
        if t.greater_is_better is None:
            t.greater_is_better = not t.metric_for_best_model.endswith("_loss")
    if not t.load_best_model_at_end:
        return
    if t.eval_strategy == "no" or t.save_strategy != t.eval_strategy:
        raise UsageError(
            f"--load_best_model_at_end needs --save_strategy equal to --eval_strategy (got save {t.save_strategy}, "
            f"eval {t.eval_strategy})", "pass the same epoch or steps to both")
    eval_steps = t.eval_steps or t.logging_steps
    if t.save_strategy == "steps" and t.save_steps % eval_steps:
        raise UsageError(
            f"--load_best_model_at_end needs --save_steps to be a multiple of the evaluation interval (got "
            f"--save_steps {t.save_steps}, evaluation every {eval_steps} steps)",
            f"pass e.g. --save_steps {eval_steps * max(1, t.save_steps // eval_steps)}")


def _validate_horovod(h: HorovodArguments, t: TrainingArguments) -> None:
    if h.compression not in ("none", "fp16"):
        raise UsageError(f"unknown --compression {h.compression!r}", "use none or fp16")
    if h.op not in ("average", "adasum"):
        raise UsageError(f"unknown --op {h.op!r}", "use average or adasum")
    if h.op == "adasum" and h.gradient_predivide_factor != 1.0:
        raise UsageError("--gradient_predivide_factor only applies to --op average", "drop it or use average")
    if h.horovod_groups is not None and h.horovod_groups < 0:
        raise UsageError(f"--horovod_groups must be >= 0 (got {h.horovod_groups})", "pass 0 (per tensor), 1, 2, ...")
    if h.autotune_log and not h.autotune:
        raise UsageError("--autotune_log without --autotune", "add --autotune or drop --autotune_log")
    if h.elastic_commit_steps <= 0:
        raise UsageError(f"--elastic_commit_steps must be > 0 (got {h.elastic_commit_steps})", "pass e.g. 10")
    if h.op == "adasum" and t.engine == "horovod":
        _validate_adasum(t)
    if not h.elastic:
        return
    if t.engine != "horovod":
        raise UsageError(f"--elastic needs --engine horovod (got {t.engine})", "drop --elastic or use horovod")
    if t.group_by_length:
        raise UsageError("--group_by_length does not work with --elastic", "drop one of the two flags")
    if h.horovod_groups:  # a joining worker's grouped all-reduce never matches the running workers'
        raise UsageError("--horovod_groups does not work with --elastic (a joining worker stalls)",
                         "drop --horovod_groups (elastic runs all-reduce per tensor)")


def _validate_adasum(t: TrainingArguments) -> None:
    """Horovod's Adasum optimizer steps each rank's optimizer inside the backward pass (its delta
    optimizer) and combines the updates, so there is no gradient left to clip or unscale afterwards."""
    if t.max_grad_norm > 0:
        raise UsageError(f"--op adasum cannot clip gradients (--max_grad_norm {t.max_grad_norm}): it steps each "
                         "rank's optimizer inside the backward pass", "add --max_grad_norm 0, or use --op average")
    if t.fp16:
        raise UsageError("--op adasum cannot use --fp16's loss scaling: it steps inside the backward pass, "
                         "before the gradients could be unscaled", "use --bf16, or --op average")
