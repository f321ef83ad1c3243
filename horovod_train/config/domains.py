"""Every argument's domain, checked before anything is written (one line, exit 2, as errors.py says).

``DOMAINS`` has one entry per field of the model, data and training sections; an engine's options carry theirs in
their fields' metadata (``"domain"``), beside the engine's row (engines/specs.py); tests/unit/test_domains.py fails
for a field without one. A domain checks one value; ``None`` (an optional argument left unset) is always in it.
Ranges follow transformers' ``TrainingArguments`` where it checks one (warmup_ratio in [0, 1]) and
what torch, NumPy and Horovod accept otherwise (AdamW's eps and weight decay >= 0, NumPy's seed below
2**32). The fixed sets of values are the ``Literal`` types below, which the argument dataclasses use as
their fields' types (HfArgumentParser lists them in --help; the domain refuses a value outside, from the
command line and from a config file alike). Each dataclass's ``__post_init__`` runs its fields' domains
(``check_section``) and then the rules between them.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

from horovod_train.common.errors import UsageError
from horovod_train.data.glue import check_task
from horovod_train.outputs.trackers import check_report_to
from horovod_train.training.schedule import SCHEDULES
from horovod_train.training.stopping import parse_signals

NAME_MAX = 255  # bytes of one path component (Linux file systems)
PATH_MAX = 4096  # bytes of a whole path, its terminating NUL included
SEED_MAX = 2**32 - 1  # numpy.random.seed's limit
# Milliseconds of this many seconds still fit a signed 32-bit int, the narrowest type a timeout passes through.
TIMEOUT_MAX_S = (2**31 - 1) // 1000
DATA_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".parquet")
# Signals a handler can catch that nothing sends in a healthy run: not SIGKILL/SIGSTOP (cannot be caught),
# not the faults a Python handler cannot resume from, not those the OS sends in normal operation (a data
# loader worker's exit sends SIGCHLD, a resized terminal SIGWINCH).
UNCATCHABLE = {"SIGKILL", "SIGSTOP"}
NOT_STOP_SIGNALS = {"SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS", "SIGABRT", "SIGCHLD", "SIGCLD",
                    "SIGWINCH", "SIGURG", "SIGCONT", "SIGPIPE", "SIGTTIN", "SIGTTOU", "SIGTSTP", "SIGPROF",
                    "SIGVTALRM", "SIGIO", "SIGPOLL"}  # fmt: skip

Check = Callable[[str, Any], None]  # (argument name, value) -> None, or raises UsageError

# The fixed sets, as the dataclasses' field types (HfArgumentParser lists their values in --help); those of a
# registry are read from it: the learning-rate schedules (the engines': their rows' names, config/parsing.py). An
# engine's own sets are its options module's.
Strategy = Literal["epoch", "steps", "no"]
# transformers' --log_level: passive leaves the libraries' levels as this project sets them (errors only).
LogLevel = Literal["passive", "debug", "info", "warning", "error", "critical"]
ScheduleName = Literal[SCHEDULES]
# Transformers' names: its Trainer's default is the fused AdamW (one kernel per tensor, not one per operation).
OptimizerName = Literal["adamw_torch_fused", "adamw_torch"]
# torch.optim.AdamW's ``fused`` for each (None: torch's choice, per-tensor operations on CPU).
ADAMW_FUSED: dict[str, bool | None] = {"adamw_torch_fused": True, "adamw_torch": None}
# torch.compile's backends and modes by transformers' names (--torch_compile_backend, --torch_compile_mode). The
# backends are the ones torch ships that train: inductor (the default: Triton kernels on GPUs, C++ on CPUs),
# aot_eager (TorchDynamo and AOTAutograd, the kernels left eager: what compile changes about autograd, without
# code generation), eager (TorchDynamo alone) and cudagraphs.
CompileBackend = Literal["inductor", "aot_eager", "eager", "cudagraphs"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
AttnImplementation = Literal["eager", "sdpa", "flash_attention_2", "flex_attention"]  # transformers' names


def refuse(name: str, rule: str, value: Any, example: str, fix: str | None = None) -> UsageError:
    return UsageError(f"--{name} must be {rule} (got {value})", fix or f"pass e.g. --{name} {example}")


@dataclass(frozen=True)
class Number:
    """A finite number in [low, high] (open ends with low_open / high_open; None: unbounded)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    example: str = "1"
    fix: str | None = None  # a fix of its own, where "pass e.g. --name example" is not the helpful one

    def rule(self, integer: bool) -> str:
        low, high = _number(self.low), _number(self.high)
        if integer and self.high is not None:
            return f"in {low}..{high}"
        if integer:
            return "> 0" if self.low == 1 else f">= {low}"
        if self.high is not None:
            return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        return f"{'>' if self.low_open else '>='} {low} and finite"

    def contains(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def __call__(self, name: str, value: Any) -> None:
        if value is not None and not self.contains(value):
            raise refuse(name, self.rule(isinstance(value, int)), value, self.example, self.fix)


def _number(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def count(minimum: int, maximum: int | None = None, example: str = "1", fix: str | None = None) -> Number:
    return Number(minimum, maximum, example=example, fix=fix)


@dataclass(frozen=True)
class StepsOrRatio:
    """A step interval as transformers' TrainingArguments takes it: a whole number of steps (>= ``minimum``), or a
    float in (0, 1), a share of the run's steps."""

    minimum: int
    example: str

    def __call__(self, name: str, value: Any) -> None:
        if value is None or 0 < value < 1:
            return
        if not math.isfinite(value) or value < self.minimum or value != int(value):
            rule = f"a whole number >= {self.minimum} of steps, or a ratio in (0, 1) of the run's steps"
            raise refuse(name, rule, value, self.example)


def choice(*options: str) -> Check:
    """One of ``options`` (``one_of`` takes them from a Literal type)."""

    def check(name: str, value: Any) -> None:
        if value is not None and value not in options:
            raise UsageError(f"unknown --{name} {value!r}", f"use {', '.join(options)}")

    return check


def one_of(values: Any) -> Check:
    return choice(*get_args(values))


def boolean(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise refuse(name, "true or false", value, "true")


def text(name: str, value: Any) -> None:
    """Any non-empty text without control characters (a name, a column, a metric)."""
    if value is None:
        return
    if not value.strip():
        raise UsageError(f"--{name} is empty", f"give --{name} a value, or drop it")
    if any(ord(c) < 32 for c in value):
        raise UsageError(f"--{name} {value!r} holds a control character", f"pass a plain --{name}")


def path_problem(value: str) -> str | None:
    """Why ``value`` cannot be a path on Linux, or None."""
    encoded = os.fsencode(value)
    if len(encoded) >= PATH_MAX:
        return f"is {len(encoded)} bytes long (paths end below {PATH_MAX})"
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return f"has a {len(longest)}-byte name {longest[:24].decode(errors='replace')}... (names end at {NAME_MAX})"
    return None


def path(name: str, value: Any) -> None:
    """A name or path (a hub name is a path here too): non-empty, and short enough to open."""
    text(name, value)
    if value is None:
        return
    problem = path_problem(value)
    if problem:
        raise UsageError(f"--{name} {value[:60]}... {problem}", f"pass a shorter --{name}")


def existing_ancestor(target: Path) -> Path:
    """``target`` or its nearest ancestor that exists."""
    existing = target.absolute()
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    return existing


def writable_below(name: str, value: str, target: Path) -> None:
    """What the run will create at ``target`` can be created: its nearest existing ancestor is a directory we
    can write to (a real probe: root passes os.access on read-only mounts)."""
    existing = existing_ancestor(target)
    if existing.is_symlink() and not existing.exists():
        raise UsageError(
            f"--{name} {value}: {existing} is a symbolic link to {os.readlink(existing)}, which does not exist",
            "create the link's target, or pass another path",
        )
    if not existing.is_dir():
        raise UsageError(f"--{name} {value} lies inside the file {existing}", "pass a path under a directory")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as exc:
        raise UsageError(
            f"--{name} {value}: cannot write in {existing} ({exc.strerror})",
            f"pass a --{name} in a directory you can write to",
        ) from None


def writable_dir(name: str, value: Any) -> None:
    path(name, value)
    if value is not None:
        if Path(value).exists() and not Path(value).is_dir():
            raise UsageError(f"--{name} {value} is a file", "pass a directory path")
        writable_below(name, value, Path(value))


def writable_file(name: str, value: Any) -> None:
    path(name, value)
    if value is not None:
        if Path(value).is_dir():
            raise UsageError(f"--{name} {value} is a directory", "pass a file path")
        writable_below(name, value, Path(value).absolute().parent)


def data_file(name: str, value: Any) -> None:
    path(name, value)
    if value is None:
        return
    file = Path(value)
    if file.suffix.lower() not in DATA_SUFFIXES:
        raise UsageError(
            f"--{name} {value} has unsupported extension {file.suffix.lower()!r}",
            "use .csv, .tsv, .json, .jsonl or .parquet",
        )
    if file.is_dir():
        raise UsageError(f"--{name} {value} is a directory", f"pass a {', '.join(DATA_SUFFIXES)} file")
    if not file.is_file():
        raise UsageError(f"--{name} {value} does not exist", f"pass an existing file to --{name}")


def run_name(name: str, value: Any) -> None:
    """The trackers' name of the run: TensorBoard writes under <output_dir>/runs/<run_name>, so it must stay there."""
    path(name, value)
    if value is not None and (value.startswith(("/", "~")) or ".." in Path(value).parts):
        raise UsageError(
            f"--run_name {value} would write outside --output_dir/runs",
            "pass a plain name (e.g. --run_name mnli-lr2e-5)",
        )


def checkpoint(name: str, value: Any) -> None:
    path(name, value)


def stop_signals(name: str, value: Any) -> None:
    text(name, value)
    try:
        signals = parse_signals(value)
    except KeyError as unknown:
        raise UsageError(f"--{name}: unknown signal {unknown}", "pass e.g. SIGTERM,SIGUSR1") from None
    for sig in signals:
        if sig.name in UNCATCHABLE | NOT_STOP_SIGNALS:
            why = "cannot be caught" if sig.name in UNCATCHABLE else "is not a stop request"
            raise UsageError(
                f"--{name}: {sig.name} {why}",
                "pass signals a scheduler sends to stop a job, e.g. SIGTERM,SIGUSR1 (or none)",
            )
    if len(signals) != len(set(signals)):
        raise UsageError(f"--{name} {value} names a signal twice", "name each signal once")


def report_to(name: str, value: Any) -> None:
    check_report_to(value)


def use_peft(name: str, value: Any) -> None:
    boolean(name, value)
    if value:
        from horovod_train.models.lora import check_installed  # lora.py imports torch, which --help does not need

        check_installed()


def save_safetensors(name: str, value: Any) -> None:
    boolean(name, value)
    if value is False:
        raise UsageError("--save_safetensors false: this project writes the model as safetensors only (transformers' "
                         "default; from_pretrained reads it)", "drop --save_safetensors false")  # fmt: skip


# save_pretrained's max_shard_size as a string: a positive number and a unit, which huggingface_hub's split parses
# (parse_size_to_int: units of 1000; tests/unit/test_domains.py holds the two to the same values).
SHARD_SIZE = re.compile(r"\s*(\d+\.?\d*|\.\d+)\s*[KMGT]B\s*", re.IGNORECASE)


def shard_size(name: str, value: Any) -> None:
    size = SHARD_SIZE.fullmatch(str(value))
    if size is None or float(size.group(1)) <= 0:
        raise UsageError(f"--{name} {value} is not a size",
                         f"give a number and a unit of KB, MB, GB or TB, e.g. --{name} 5GB")  # fmt: skip


def task(name: str, value: Any) -> None:
    check_task(value)


FRACTION = Number(0.0, 1.0, high_open=True, example="0.1")  # [0, 1): dropout, label smoothing, Adam's betas

DOMAINS: dict[str, Check] = {
    # model
    "model_name_or_path": path,
    "config_name": path,
    "tokenizer_name": path,
    "cache_dir": writable_dir,
    "model_revision": text,
    "token": text,
    "trust_remote_code": boolean,
    "attn_implementation": one_of(AttnImplementation),
    "use_peft": use_peft,
    "lora_r": count(1, 4096, example="8"),
    "lora_alpha": count(1, example="16"),
    "lora_dropout": FRACTION,
    "lora_target_modules": text,
    # data
    "task_name": task,
    "dataset_name": path,
    "dataset_config_name": text,
    "train_file": data_file,
    "validation_file": data_file,
    "test_file": data_file,
    "text_column_names": text,
    "label_column_name": text,
    "validation_split_name": text,
    "validation_split_percentage": count(1, 99, "10"),
    "max_seq_length": count(1, example="128"),
    "pad_to_max_length": boolean,
    "overwrite_cache": boolean,
    "max_train_samples": count(1, example="1000"),
    "max_eval_samples": count(1, example="1000"),
    "max_predict_samples": count(1, example="1000"),
    "synthetic_num_examples": count(2, example="8000"),
    "num_labels": count(1, example="3"),
    "preprocessing_num_workers": count(1, example="4"),
    "pad_to_multiple_of": count(1, example="8"),
    "length_buckets": count(0, example="4"),
    # training
    "output_dir": path,  # its own checks (a file, not writable, an earlier run): run_directory.RunDirectory.claim
    "overwrite_output_dir": boolean,
    "per_device_train_batch_size": count(1, example="32"),
    "per_device_eval_batch_size": count(1, example="64"),
    "learning_rate": Number(0.0, low_open=True, example="5e-5"),
    "weight_decay": Number(0.0, example="0.01"),
    "adam_beta1": Number(0.0, 1.0, high_open=True, example="0.9"),
    "adam_beta2": Number(0.0, 1.0, high_open=True, example="0.999"),
    "adam_epsilon": Number(0.0, example="1e-8"),
    "num_train_epochs": Number(0.0, example="3"),
    "max_steps": count(-1, example="1000"),
    "lr_scheduler_type": one_of(ScheduleName),
    "optim": one_of(OptimizerName),
    "warmup_ratio": Number(0.0, 1.0, example="0.1"),
    "warmup_steps": count(0, example="500"),
    "gradient_accumulation_steps": count(1, example="2"),
    "max_grad_norm": Number(0.0, example="1.0"),
    "label_smoothing_factor": FRACTION,
    "multi_label_threshold": Number(0.0, 1.0, low_open=True, high_open=True, example="0.5"),
    "seed": count(0, SEED_MAX, example="42"),
    "logging_steps": StepsOrRatio(1, "50"),
    "eval_strategy": one_of(Strategy),
    "eval_steps": StepsOrRatio(1, "500"),
    "do_train": boolean,
    "do_eval": boolean,
    "do_predict": boolean,
    "use_cpu": boolean,
    "log_level": one_of(LogLevel),
    "save_safetensors": save_safetensors,
    "dropout": FRACTION,
    "dataloader_num_workers": count(0, example="2"),
    "disable_tqdm": boolean,
    "report_to": report_to,
    "run_name": run_name,
    "load_best_model_at_end": boolean,
    "metric_for_best_model": text,
    "greater_is_better": boolean,
    "save_strategy": one_of(Strategy),
    "save_steps": StepsOrRatio(0, "500"),
    "save_total_limit": count(1, fix="pass --save_strategy no to write no checkpoints, or None to keep them all"),
    "max_shard_size": shard_size,
    "save_async": boolean,
    "resume_from_checkpoint": checkpoint,
    "checkpoint_signals": stop_signals,
    "ddp_timeout": count(1, TIMEOUT_MAX_S, example="1800"),
    "audit_samples": boolean,
    "bf16": boolean,
    "fp16": boolean,
    "tf32": boolean,
    "torch_compile": boolean,
    "torch_compile_backend": one_of(CompileBackend),
    "torch_compile_mode": one_of(CompileMode),
    "gradient_checkpointing": boolean,
    "group_by_length": boolean,
    "padding_free": boolean,
    "auto_find_batch_size": boolean,
}


def domain_of(f: Field) -> Check:
    """A field's domain: its metadata's "domain" (an engine's options carry theirs: engines/specs.py), else
    DOMAINS's entry."""
    return f.metadata.get("domain") or DOMAINS[f.name]


def check_section(section: Any) -> None:
    """Each field of an argument dataclass against its domain, in the order of ``--help``."""
    for f in fields(section):
        domain_of(f)(f.name, getattr(section, f.name))


# The environment is input too: the variables this project, Horovod, NCCL and torch.distributed read, each with its
# domain. Horovod and NCCL read numbers with C's strtol/strtod, which stop at the first character that is not a
# digit: HOROVOD_FUSION_THRESHOLD=64MB is a 64-byte fusion buffer and HOROVOD_CYCLE_TIME=fast a zero cycle time, and
# nothing says so. Checked by train, doctor and bench allreduce (check_environment) before anything starts.
C_INTEGER = re.compile(r"\s*[+-]?\d+")
C_FLOAT = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


@dataclass(frozen=True)
class Variable:
    """An environment variable's domain: a number (``number``, whole with ``integer``, in ``unit``) or one of
    ``words`` (any case), or any non-empty text without spaces; ``reader``: who reads it; ``example``: a good value."""

    reader: str
    number: Number | None = None
    integer: bool = True
    unit: str = ""
    words: tuple[str, ...] = ()
    example: str = "1"

    def problem(self, value: str) -> str | None:
        """Why ``value`` is outside the domain (what the reader would make of it), or None."""
        if not value.strip():
            return "is empty"
        if self.words:
            return None if value.lower() in self.words else f"is not one of {', '.join(self.words)}"
        if self.number is None:
            return f"holds a space ({self.reader} reads one word)" if any(c.isspace() for c in value) else None
        try:
            parsed = int(value) if self.integer else float(value)
        except ValueError:
            read = self.c_reading(value)
            kind = ("a whole number" if self.integer else "a number") + (f" of {self.unit}" if self.unit else "")
            return f"is not {kind} ({self.reader} reads it as {read})"
        if not self.number.contains(parsed):
            return f"must be {self.number.rule(self.integer)}{self.unit_words()}"
        return None

    def c_reading(self, value: str) -> str:
        """What C's strtol/strtod make of ``value``: its leading number, else 0."""
        match = (C_INTEGER if self.integer else C_FLOAT).match(value)
        return match[0].strip() if match else "0"

    def unit_words(self) -> str:
        return f" ({self.unit})" if self.unit else ""


SWITCH = ("0", "1")  # Horovod reads its switches with strtol: "true" is 0, off
HOROVOD, NCCL, TORCH, THIS = "Horovod", "NCCL", "torch.distributed", "horovod-train"
VARIABLES: dict[str, Variable] = {
    # Horovod's knobs (read once, at hvd.init)
    "HOROVOD_FUSION_THRESHOLD": Variable(HOROVOD, Number(0), unit="bytes", example="67108864"),
    "HOROVOD_CYCLE_TIME": Variable(HOROVOD, Number(0.0, low_open=True), integer=False, unit="ms", example="1"),
    "HOROVOD_CACHE_CAPACITY": Variable(HOROVOD, Number(0), unit="tensors", example="1024"),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": Variable(HOROVOD, Number(0), unit="seconds", example="60"),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": Variable(HOROVOD, Number(0), unit="seconds", example="1800"),
    "HOROVOD_STALL_CHECK_DISABLE": Variable(HOROVOD, words=SWITCH),
    "HOROVOD_AUTOTUNE": Variable(HOROVOD, words=SWITCH),
    "HOROVOD_HIERARCHICAL_ALLREDUCE": Variable(HOROVOD, words=SWITCH),
    "HOROVOD_HIERARCHICAL_ALLGATHER": Variable(HOROVOD, words=SWITCH),
    "HOROVOD_TIMELINE_MARK_CYCLES": Variable(HOROVOD, words=SWITCH),
    "HOROVOD_CPU_OPERATIONS": Variable(HOROVOD, words=("gloo", "mpi", "ccl"), example="gloo"),
    # this project's own
    "HOROVOD_TRAIN_DEBUG": Variable(THIS, words=SWITCH),
    "HOROVOD_TRAIN_SPIN_WAIT": Variable(THIS, words=SWITCH),
    "OMP_NUM_THREADS": Variable(THIS, Number(1), unit="threads", example="4"),
    # NCCL's
    "NCCL_DEBUG": Variable(NCCL, words=("version", "warn", "info", "trace", "abort"), example="WARN"),
    "NCCL_SOCKET_IFNAME": Variable(NCCL, example="eth0"),
    "NCCL_IB_DISABLE": Variable(NCCL, words=SWITCH),
    "NCCL_P2P_DISABLE": Variable(NCCL, words=SWITCH),
    # torch.distributed's env:// rendezvous (torchrun sets them; a hand-started job sets them itself)
    "MASTER_ADDR": Variable(TORCH, example="127.0.0.1"),
    "MASTER_PORT": Variable(TORCH, Number(1, 65535), example="29500"),
    "RANK": Variable(TORCH, Number(0), example="0"),
    "WORLD_SIZE": Variable(TORCH, Number(1), unit="processes", example="2"),
    "LOCAL_RANK": Variable(TORCH, Number(0), example="0"),
    "LOCAL_WORLD_SIZE": Variable(TORCH, Number(1), unit="processes", example="2"),
}
# (rank, size): a rank counts from 0 to size - 1.
RANK_PAIRS = (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE"))


def check_environment(env: Mapping[str, str]) -> None:
    """Every variable of VARIABLES that ``env`` sets, in its domain; then each rank below its size."""
    for name, variable in VARIABLES.items():
        if name in env and (problem := variable.problem(env[name])):
            raise UsageError(
                f"environment variable {name}={env[name]!r} {problem}",
                f"export {name}={variable.example}, or unset {name} ({variable.reader} reads it)",
            )
    for rank, size in RANK_PAIRS:
        if rank in env and size in env and int(env[rank]) >= int(env[size]):
            raise UsageError(
                f"environment variable {rank}={env[rank]} but {size}={env[size]} (ranks count from 0 to {size} - 1)",
                f"unset {rank} {size} if they are left over from an earlier torchrun, or set {rank} below {size}",
            )
