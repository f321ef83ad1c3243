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

from horovod_train.domains import STRATEGIES, check_domains, path_problem
from horovod_train.errors import UsageError
from horovod_train.schedule import SCHEDULES

EVAL_STRATEGIES = SAVE_STRATEGIES = STRATEGIES
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
        columns = self.text_columns()
        if columns is not None and (not 1 <= len(columns) <= 2 or not all(columns)):
            raise UsageError(
                f"--text_column_names takes one or two column names (got {self.text_column_names!r})",
                "pass e.g. --text_column_names sentence or --text_column_names sentence1,sentence2",
            )
        if self.validation_split_name is not None and (
            self.train_file or (self.dataset_name in (None, "synthetic-nli") and not self.task_name)
        ):
            source = f"--train_file {self.train_file}" if self.train_file else f"--dataset_name {self.dataset_name}"
            raise UsageError(f"--validation_split_name {self.validation_split_name}: {source} has no named splits",
                             "drop it (10% of train is held out), or pass --validation_file")


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
    problem = path_problem(spec)
    if problem:
        raise UsageError(f"--config {spec[:60]}... {problem}", "pass a shorter path to --config")
    path = Path(spec)
    if path.is_dir():
        raise UsageError(f"config file {spec} is a directory", "pass a YAML/JSON file (or 'demo') to --config")
    if path.is_file():
        return path
    packaged = resources.files("horovod_train") / PACKAGED_CONFIGS / f"{spec}.yaml"
    if packaged.is_file():
        return Path(str(packaged))
    raise UsageError(f"config file {spec} does not exist", "pass an existing YAML/JSON file (or 'demo') to --config")


def _read_config_text(spec: str, config_file: Path) -> str:
    try:
        return config_file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"config file {spec} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                         f"{exc.start})", "save it as UTF-8") from None
    except OSError as exc:
        raise UsageError(f"config file {spec} cannot be read ({exc.strerror})", "pass a readable file") from None


def load_config_file(spec: str) -> dict[str, Any]:
    config_file = config_path(spec)
    text = _read_config_text(spec, config_file)
    try:
        data = json.loads(text) if config_file.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        first_line = str(exc).splitlines()[0]
        raise UsageError(f"config file {spec} is malformed ({first_line})", "fix its syntax") from None
    data = data or {}
    if not isinstance(data, dict):
        raise UsageError(f"config file {spec} is not a mapping of argument names", "write `name: value` lines")
    odd = [repr(key) for key in data if not isinstance(key, str)]
    if odd:
        raise UsageError(f"config file {spec} has key(s) that are not argument names: {', '.join(odd[:5])}",
                         "use argument names from `horovod-train train --help` as keys")
    unknown = sorted(set(data) - set(_all_fields()))
    if unknown:
        raise UsageError(
            f"unknown key(s) in {spec}: {', '.join(unknown)}",
            "use argument names from `horovod-train train --help`",
        )
    return data


def _coerce(name: str, value: Any) -> Any:
    """A config file's value as the argument's type: YAML's scalars only (a list, a mapping, or true for a
    number is refused, not turned into text or 1)."""
    kind, optional = _field_type(_all_fields()[name])
    if value is None:
        if optional:
            return None
        raise UsageError(f"{name} must not be null", f"give {name} a value or drop it")
    try:
        if isinstance(value, list | dict | set | tuple) or (isinstance(value, bool) and kind is not bool):
            raise ValueError
        if kind is bool:
            return str_to_bool(value if isinstance(value, bool) else str(value))
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return kind(value)
    except (TypeError, ValueError, OverflowError, argparse.ArgumentTypeError):
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
    """Each argument against its domain (domains.py), then the rules between arguments."""
    check_domains(config.to_dict())
    config.data.check()
    _validate_training(config.training)
    _validate_horovod(config.horovod, config.training)


def _validate_training(t: TrainingArguments) -> None:
    if t.save_strategy == "steps" and not t.save_steps:
        raise UsageError("--save_strategy steps needs --save_steps", "pass e.g. --save_steps 500")
    if t.max_steps <= 0 and t.num_train_epochs <= 0:
        raise UsageError("nothing to train: --num_train_epochs <= 0 and no --max_steps", "set one of them > 0")
    if not (t.do_train and t.do_eval):
        flag = "--do_train" if not t.do_train else "--do_eval"
        raise UsageError(f"{flag} false: `train` always trains and evaluates",
                         "drop the flag (--eval_strategy no evaluates only once, at the end)")
    _validate_best_model(t)
    if t.bf16 and t.fp16:
        raise UsageError("--bf16 and --fp16 are both set", "choose one of them")


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
    if h.op == "adasum" and h.gradient_predivide_factor != 1.0:
        raise UsageError("--gradient_predivide_factor only applies to --op average", "drop it or use average")
    if h.autotune_log and not h.autotune:
        raise UsageError("--autotune_log without --autotune", "add --autotune or drop --autotune_log")
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
