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

from horovod_train.errors import UsageError
from horovod_train.stopping import parse_signals

PACKAGED_CONFIGS = "configs"  # horovod_train/configs/<name>.yaml, found by name after any install


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        default="tiny-bert",
        metadata={"help": "Hub name or local directory, or 'tiny-bert' (random init, tokenizer trained locally)."},
    )
    tokenizer_name: str | None = field(default=None, metadata={"help": "Defaults to model_name_or_path."})
    cache_dir: str | None = field(
        default=None, metadata={"help": "Where tokenized data and trained tokenizers are cached."}
    )


@dataclass
class DataArguments:
    dataset_name: str | None = field(
        default="synthetic-nli",
        metadata={"help": "Hub dataset (e.g. multi_nli) or 'synthetic-nli'. Ignored when --train_file is set."},
    )
    dataset_config_name: str | None = None
    train_file: str | None = field(default=None, metadata={"help": "csv, tsv, json or jsonl file."})
    validation_file: str | None = None
    validation_split_name: str | None = field(
        default=None, metadata={"help": "Hub split to validate on (e.g. validation_matched)."}
    )
    validation_split_percentage: int = field(
        default=10, metadata={"help": "Held out of train when there is no validation file/split."}
    )
    max_seq_length: int = 128
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    synthetic_num_examples: int = field(
        default=8000, metadata={"help": "Size of the generated synthetic-nli set (before the split)."}
    )
    num_labels: int = 3


@dataclass
class TrainingArguments:
    output_dir: str = "runs/train"
    overwrite_output_dir: bool = False
    engine: str = field(default="horovod", metadata={"help": "Data-parallel engine: horovod, ddp, dp or single."})
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 64
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    adam_epsilon: float = 1e-8
    num_train_epochs: float = 3.0
    max_steps: int = field(default=-1, metadata={"help": "If > 0, overrides num_train_epochs."})
    warmup_ratio: float = 0.0
    warmup_steps: int = 0
    gradient_accumulation_steps: int = 1
    max_grad_norm: float = field(default=1.0, metadata={"help": "0 disables clipping."})
    seed: int = 42
    logging_steps: int = 50
    dropout: float | None = field(default=None, metadata={"help": "Override the model's dropout (0 = off)."})
    dataloader_num_workers: int = 0
    disable_tqdm: bool = False
    # Checkpoints.
    save_steps: int = field(default=0, metadata={"help": "Checkpoint every N steps (0: only at epoch ends)."})
    save_total_limit: int = field(default=2, metadata={"help": "Checkpoints kept (0: write none)."})
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
    gradient_predivide_factor: float = 1.0
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


def _str_to_bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    lowered = value.lower()
    if lowered in ("yes", "true", "t", "y", "1"):
        return True
    if lowered in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {value!r}")


def _optional(kind: type):
    def parse(value: str):
        return None if value.lower() in ("none", "null") else kind(value)

    parse.__name__ = kind.__name__
    return parse


def _field_type(f: dataclasses.Field) -> tuple[type, bool]:
    """(base type, optional?) from the string annotations of the dataclasses above."""
    annotation = str(f.type)
    optional = "None" in annotation
    base = annotation.replace("| None", "").strip()
    return {"str": str, "int": int, "float": float, "bool": bool}[base], optional


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML or JSON file (or a packaged config name: demo) of the arguments below.")
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"{SECTION_TITLES[section]} arguments")
        for f in dataclasses.fields(cls):
            kind, optional = _field_type(f)
            help_text = f.metadata.get("help", "")
            if kind is bool:
                group.add_argument(f"--{f.name}", type=_str_to_bool, nargs="?", const=True, help=help_text)
            else:
                group.add_argument(f"--{f.name}", type=_optional(kind) if optional else kind, help=help_text)
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
            return _str_to_bool(value if isinstance(value, bool) else str(value))
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
    values.update({k: v for k, v in vars(args).items() if k in _all_fields() and v is not None})
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
        "num_labels": d.num_labels,
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


def _validate_training(t: TrainingArguments) -> None:
    for name in ("save_steps", "save_total_limit"):
        if getattr(t, name) < 0:
            raise UsageError(f"--{name} must be >= 0 (got {getattr(t, name)})", f"pass --{name} 0 or more")
    if t.learning_rate <= 0:
        raise UsageError(f"--learning_rate must be > 0 (got {t.learning_rate})", "pass e.g. --learning_rate 5e-5")
    if t.max_steps <= 0 and t.num_train_epochs <= 0:
        raise UsageError("nothing to train: --num_train_epochs <= 0 and no --max_steps", "set one of them > 0")
    if t.dropout is not None and not 0.0 <= t.dropout < 1.0:
        raise UsageError(f"--dropout must be in [0, 1) (got {t.dropout})", "pass e.g. --dropout 0.1")
    if t.bf16 and t.fp16:
        raise UsageError("--bf16 and --fp16 are both set", "choose one of them")
    if t.ddp_timeout <= 0:
        raise UsageError(f"--ddp_timeout must be > 0 seconds (got {t.ddp_timeout})", "pass e.g. --ddp_timeout 1800")
    try:
        parse_signals(t.checkpoint_signals)
    except KeyError as unknown:
        raise UsageError(f"--checkpoint_signals: unknown signal {unknown}", "pass e.g. SIGTERM,SIGUSR1") from None


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
