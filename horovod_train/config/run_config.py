"""Run configuration: dataclasses in the style of transformers' run_glue.py, one per section of train's arguments,
and ``RunConfig``, the run's sections together (what the engines and the training loop read).

Each dataclass is a section of ``--help`` and checks itself when built (``__post_init__``: its fields' domains from
domains.py, then the rules between them); ``RunConfig`` checks the rules between sections. The engine-only sections
are the engine rows' options (engines/specs.py), each read by its engine alone. This module reads no engine row (the
engines import it): the rows' part of train's arguments (--engine's values and check, the option sections, the
parser and --config files) is parsing.py's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, TypeVar

from horovod_train.common.errors import UsageError
from horovod_train.config.domains import (
    AttnImplementation,
    CompileBackend,
    CompileMode,
    LogLevel,
    OptimizerName,
    ScheduleName,
    Strategy,
    check_section,
)

# --logging_steps's default: every 50 steps, or more often where that would leave a short run's curve with a few
# points: at least one every 2% of the run (a 75-step run logs every 2 steps).
LOGGING_STEPS, LOGGING_SHARE = 50, 0.02
MAX_SHARD_SIZE = "50GB"  # save_pretrained's default (transformers 5; 4.x's was 5GB)
STEP_INTERVALS = ("logging_steps", "eval_steps", "save_steps")  # steps, or a ratio of the run's (transformers')


@dataclass(frozen=True)
class StepIntervals:
    """Every how many optimizer steps the run logs, evaluates (with --eval_strategy steps) and checkpoints
    (0: not by steps), once its length is known."""

    logging: int
    eval: int
    save: int


def steps_of(interval: float, total_steps: int) -> int:
    """A step interval as transformers' Trainer resolves it: a ratio in (0, 1) is that share of the run, rounded
    up."""
    return math.ceil(total_steps * interval) if 0 < interval < 1 else int(interval)


def an_engine_rows_name(name: str, value: Any) -> None:
    """--engine's domain is the engine rows' names (engines/specs.py spec_of), checked where the rows are read: by
    parsing.py once the run's sections are built, and by create_engine."""


@dataclass
class ModelArguments:
    _argument_group_name = "model arguments"

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
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer name or directory (default: model_name_or_path)."}
    )
    cache_dir: str | None = field(
        default=None, metadata={"help": "Where tokenized data and trained tokenizers are cached."}
    )
    model_revision: str = field(
        default="main",
        metadata={"help": "The hub model's branch, tag or commit (as in run_glue.py); pin a commit to rerun a job."},
    )
    token: str | None = field(
        default=None,
        metadata={
            "help": "Hub token for gated or private models (as in run_glue.py); better: HF_TOKEN in the environment "
            "or `hf auth login` on a login node, since a token on the command line shows in ps and run_config.json."
        },
    )
    use_peft: bool = field(
        default=False,
        metadata={"help": "Train LoRA adapters (peft) and the classification head instead of every weight."},
    )
    lora_r: int = field(default=8, metadata={"help": "LoRA rank (with --use_peft)."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA scaling alpha (with --use_peft)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA path (with --use_peft)."})
    lora_target_modules: str | None = field(
        default=None,
        metadata={
            "help": "Comma-separated linear layers to adapt with --use_peft (default: peft's for the architecture: "
            "query,value for BERT; q_proj,v_proj for Llama/Qwen2/Mistral)."
        },
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={
            "help": "Run the modeling code a model directory or hub repository ships (auto_map in its config.json); "
            "read that code first: it runs on every rank."
        },
    )
    attn_implementation: AttnImplementation | None = field(
        default=None,
        metadata={"help": "The attention kernels (transformers' attn_implementation; unset: the model's default, sdpa "
                  "where it has one)."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        check_section(self)

    def reads(self) -> dict[str, str]:
        """What the run loads the model from, by flag: a directory among them must outlive the run's start (the run
        directory's check; a hub name or tiny-bert is no path there)."""
        named = {"model_name_or_path": self.model_name_or_path, "config_name": self.config_name,
                 "tokenizer_name": self.tokenizer_name}  # fmt: skip
        return {f"--{flag}": value for flag, value in named.items() if value}


@dataclass
class DataArguments:
    _argument_group_name = "data arguments"

    task_name: str | None = field(
        default=None,
        metadata={
            "help": "GLUE task (cola, mnli, mrpc, qnli, qqp, rte, sst2, stsb, wnli): its text columns, label names "
            "(stsb: a regression) and run_glue's metrics; "
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
    train_file: str | None = field(default=None, metadata={"help": "csv, tsv, json, jsonl or parquet file."})
    validation_file: str | None = field(default=None, metadata={"help": "csv, tsv, json, jsonl or parquet file."})
    test_file: str | None = field(
        default=None,
        metadata={"help": "csv, tsv, json, jsonl or parquet file to predict on (the test split); labels optional."},
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
            "help": "The one split of a hub or save_to_disk dataset to validate on, e.g. validation_matched "
            "(default: a task's or a directory's validation splits, else a part of train held out)."
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
    max_predict_samples: int | None = field(
        default=None, metadata={"help": "At most N examples of each test split (--do_predict), as in run_glue.py."}
    )
    synthetic_num_examples: int = field(
        default=8000, metadata={"help": "Size of the generated synthetic-nli set (before the split)."}
    )
    num_labels: int | None = field(
        default=None,
        metadata={"help": "Number of labels (default: inferred from the data's label names or labels); 1: regression."},
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes that tokenize (each node's local rank 0 tokenizes, once)."}
    )
    pad_to_multiple_of: int | None = field(
        default=None, metadata={"help": "Pad each batch's length up to a multiple of N (8: tensor cores)."}
    )
    length_buckets: int = field(
        default=0,
        metadata={"help": "Pad each training batch to one of N lengths, quantiles of the training data's lengths, "
                  "so that a compiled step compiles once per length, not per batch (0: to the batch's longest)."},
    )  # fmt: skip

    def text_columns(self) -> list[str] | None:
        return [name.strip() for name in self.text_column_names.split(",")] if self.text_column_names else None

    def __post_init__(self) -> None:
        check_section(self)
        columns = self.text_columns()
        if columns is not None and (not 1 <= len(columns) <= 2 or not all(columns)):
            raise UsageError(
                f"--text_column_names takes one or two column names (got {self.text_column_names!r})",
                "pass e.g. --text_column_names sentence or --text_column_names sentence1,sentence2",
            )
        if columns is not None and len(set(columns)) < len(columns):
            raise UsageError(
                f"--text_column_names names column {columns[0]!r} twice",
                f"name two different columns, or one alone (--text_column_names {columns[0]})",
            )
        if self.validation_split_name is not None and (
            self.train_file or (self.dataset_name in (None, "synthetic-nli") and not self.task_name)
        ):
            source = f"--train_file {self.train_file}" if self.train_file else f"--dataset_name {self.dataset_name}"
            raise UsageError(
                f"--validation_split_name {self.validation_split_name}: {source} has no named splits",
                "drop it (10% of train is held out), or pass --validation_file",
            )


@dataclass
class TrainingArguments:
    _argument_group_name = "training arguments"

    output_dir: str = field(
        default="runs/train", metadata={"help": "Where the model, results, logs and checkpoints go."}
    )
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Replace an earlier run in --output_dir."})
    # The first row of engines/specs.py's ENGINES, the most preferred; its values are the rows' (parsing.py).
    engine: str = field(default="horovod", metadata={"help": "Data-parallel engine.", "domain": an_engine_rows_name})
    per_device_train_batch_size: int = field(default=32, metadata={"help": "Examples per rank per micro-step."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Examples per rank per evaluation batch."})
    optim: OptimizerName = field(
        default="adamw_torch_fused",
        metadata={"help": "AdamW's implementation: fused (one kernel per tensor; Transformers' default) or not."},
    )
    learning_rate: float = field(default=5e-5, metadata={"help": "AdamW's peak learning rate (after warmup)."})
    weight_decay: float = field(
        default=0.0, metadata={"help": "AdamW's weight decay (not on biases and LayerNorm weights)."}
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW's beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW's beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW's epsilon."})
    num_train_epochs: float = field(default=3.0, metadata={"help": "Epochs to train (fractions allowed)."})
    max_steps: int = field(default=-1, metadata={"help": "If > 0, overrides num_train_epochs."})
    lr_scheduler_type: ScheduleName = field(
        default="linear", metadata={"help": "Learning-rate schedule after the warmup."}
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
        default=0.0,
        metadata={"help": "Label smoothing epsilon in the training and eval loss (0: off; classification only)."},
    )
    multi_label_threshold: float = field(
        default=0.5,
        metadata={"help": "Multi-label data: a label is predicted where its sigmoid probability exceeds this."},
    )
    seed: int = field(default=42, metadata={"help": "Seed of the model init, the data order and synthetic-nli."})
    logging_steps: float | None = field(
        default=None,
        metadata={
            "help": "Log the training loss every N steps, or a ratio in (0, 1) of the run's steps (as transformers) "
            f"(default: {LOGGING_STEPS}, or more often in a short run: a point at least every "
            f"{LOGGING_SHARE:.0%} of the run)."
        },
    )
    eval_strategy: Strategy = field(
        default="epoch", metadata={"help": "When to evaluate during training: epoch, steps (every --eval_steps) or no."}
    )
    eval_steps: float | None = field(
        default=None,
        metadata={
            "help": "With --eval_strategy steps: evaluate every N steps, or a ratio in (0, 1) of the run's steps "
            f"(default: --logging_steps if given, else {LOGGING_STEPS})."
        },
    )
    do_train: bool = field(default=True, metadata={"help": "Accepted for run_glue.py command lines: a run trains."})
    do_eval: bool = field(
        default=True, metadata={"help": "Accepted for run_glue.py command lines: a run ends with an evaluation."}
    )
    do_predict: bool = field(
        default=False, metadata={"help": "Write predict_results.txt for the test split (--test_file) after training."}
    )
    use_cpu: bool = field(default=False, metadata={"help": "Train on the CPU even where a GPU is visible."})
    log_level: LogLevel = field(
        default="passive",
        metadata={"help": "transformers' and datasets' log level (passive: their errors only, as by default)."},
    )
    save_safetensors: bool = field(
        default=True, metadata={"help": "Accepted for Trainer command lines: the model is written as safetensors."}
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
        metadata={
            "help": "Keep the checkpoint with the best --metric_for_best_model (rotation spares it) and end "
            "the run with its weights; needs --save_strategy equal to --eval_strategy."
        },
    )
    metric_for_best_model: str | None = field(
        default=None,
        metadata={
            "help": "What makes a checkpoint best: loss or a metric the run reports (accuracy, f1; run_glue's "
            "for a GLUE task: matthews_correlation, combined_score, pearson, spearmanr; f1_micro, f1_macro "
            "multi-label; mse regression), or <split>_<metric> for another validation split, with or without "
            "eval_ (default: loss with --load_best_model_at_end, as transformers)."
        },
    )
    greater_is_better: bool | None = field(
        default=None, metadata={"help": "Whether a larger metric is better (default: false for a loss, else true)."}
    )
    save_strategy: Strategy = field(
        default="epoch",
        metadata={
            "help": "epoch: checkpoint at epoch ends (and every --save_steps if > 0); steps: every --save_steps "
            "and at the end; no: only when a stop signal arrives."
        },
    )
    save_steps: float = field(
        default=0,
        metadata={
            "help": "Checkpoint every N steps, or a ratio in (0, 1) of the run's steps (0: none between epoch ends)."
        },
    )
    save_total_limit: int | None = field(
        default=2, metadata={"help": "Newest checkpoints of the run kept (None: all, as in transformers)."}
    )
    max_shard_size: str = field(
        default=MAX_SHARD_SIZE,
        metadata={
            "help": "The final model's safetensors files are at most this size (save_pretrained's max_shard_size: "
            "digits and a unit, 5GB, 500MB; a larger model is split into model-0000N-of-0000M.safetensors with "
            "model.safetensors.index.json)."
        },
    )
    save_async: bool = field(
        default=False,
        metadata={
            "help": "fsdp, zero1: training goes on while every rank writes its shards of a checkpoint, which appears "
            "(manifest, rename, rotation) once all are written; the next save, a stop or the end waits for it "
            "(torchtitan's checkpoint.async_mode). Other engines write their whole state at once as before."
        },
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
    # As in transformers' TrainingArguments: either one set turns --torch_compile on.
    torch_compile_backend: CompileBackend | None = field(
        default=None, metadata={"help": "torch.compile's backend, inductor if unset; sets --torch_compile."}
    )
    torch_compile_mode: CompileMode | None = field(
        default=None, metadata={"help": "torch.compile's mode, torch's if unset; sets --torch_compile."}
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "Recompute activations in the backward pass instead of storing them (less memory, ~30% more "
            "compute); non-reentrant, so it works under DDP."
        },
    )
    group_by_length: bool = field(default=False, metadata={"help": "Batch examples of similar length (less padding)."})
    padding_free: bool = field(
        default=False,
        metadata={"help": "Decoder models (Llama, Qwen2, Mistral): each training batch's examples as one row without "
                  "padding, position ids restarting per example (transformers' DataCollatorWithFlattening)."},
    )  # fmt: skip
    auto_find_batch_size: bool = field(
        default=False,
        metadata={"help": "On CUDA: halve --per_device_train_batch_size until a step of the longest batch fits, "
                  "doubling --gradient_accumulation_steps so that the global batch is kept (on CPU: kept as given)."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        check_section(self)
        for name in STEP_INTERVALS:  # a whole number of steps as an int (1e3 or 50.0 from a config file)
            value = getattr(self, name)
            if value is not None and not 0 < value < 1:
                setattr(self, name, int(value))
        if self.save_strategy == "steps" and not self.save_steps:
            raise UsageError("--save_strategy steps needs --save_steps", "pass e.g. --save_steps 500")
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise UsageError("nothing to train: --num_train_epochs <= 0 and no --max_steps", "set one of them > 0")
        if not (self.do_train and self.do_eval):
            flag = "--do_train" if not self.do_train else "--do_eval"
            raise UsageError(f"{flag} false: `train` always trains and evaluates",
                             "drop the flag (--eval_strategy no evaluates only once, at the end)")  # fmt: skip
        self._check_best_model()
        if self.bf16 and self.fp16:
            raise UsageError("--bf16 and --fp16 are both set", "choose one of them")
        if self.torch_compile_mode and self.torch_compile_backend not in (None, "inductor"):
            # torch passes the mode to Inductor alone: another backend warns and ignores it
            backend = self.torch_compile_backend
            raise UsageError(f"--torch_compile_mode is Inductor's; --torch_compile_backend {backend} ignores it",
                             "drop --torch_compile_mode, or use --torch_compile_backend inductor")  # fmt: skip
        if self.torch_compile_backend or self.torch_compile_mode:
            self.torch_compile = True

    def _check_best_model(self) -> None:
        """transformers' rules: the best checkpoint is chosen among checkpoints written right after an evaluation."""
        if self.metric_for_best_model is None and self.load_best_model_at_end:
            self.metric_for_best_model = "loss"
        if self.metric_for_best_model is not None:
            if not self.metric_for_best_model.startswith("eval_"):
                self.metric_for_best_model = f"eval_{self.metric_for_best_model}"
            if self.greater_is_better is None:
                self.greater_is_better = not self.metric_for_best_model.endswith(("_loss", "_mse"))
        if not self.load_best_model_at_end:
            return
        if self.eval_strategy == "no" or self.save_strategy != self.eval_strategy:
            raise UsageError(
                f"--load_best_model_at_end needs --save_strategy equal to --eval_strategy (got save "
                f"{self.save_strategy}, eval {self.eval_strategy})",
                "pass the same epoch or steps to both",
            )
        if self.save_strategy != "steps":
            return
        eval_steps, save_steps = self.eval_steps or self.logging_steps or LOGGING_STEPS, self.save_steps
        if (eval_steps < 1) != (save_steps < 1):  # transformers' rule: which multiple a ratio makes depends on the run
            raise UsageError(
                f"--load_best_model_at_end needs --save_steps and the evaluation interval both in steps or both as "
                f"ratios (got --save_steps {save_steps}, evaluation every {eval_steps})",
                "pass --eval_steps in the same form as --save_steps",
            )
        if round(save_steps / eval_steps, 9) % 1:
            multiple = eval_steps * max(1, round(save_steps // eval_steps))
            raise UsageError(
                f"--load_best_model_at_end needs --save_steps to be a multiple of the evaluation interval (got "
                f"--save_steps {save_steps}, evaluation every {eval_steps})",
                f"pass e.g. --save_steps {multiple:g}",
            )

    def step_intervals(self, total_steps: int) -> StepIntervals:
        """The intervals in steps for a run of ``total_steps``."""
        logging = steps_of(self.logging_steps, total_steps) if self.logging_steps else None
        adapted = min(LOGGING_STEPS, math.ceil(total_steps * LOGGING_SHARE))
        return StepIntervals(
            logging=max(1, logging or adapted),
            eval=max(1, steps_of(self.eval_steps or self.logging_steps or LOGGING_STEPS, total_steps)),
            save=steps_of(self.save_steps, total_steps),
        )


Options = TypeVar("Options")


@dataclass
class RunConfig:
    """The run's arguments: the model, data and training sections, and the engines' own options, one instance of
    each engine row's options dataclass (engines/specs.py) by its section's name (parsing.py gives every row's, the
    engines not running keeping their defaults). Here, not a field per engine: an engine is one module and one row,
    and a row added by a test brings its section. ``options`` reads one typed by its class."""

    model: ModelArguments = field(default_factory=ModelArguments)
    data: DataArguments = field(default_factory=DataArguments)
    training: TrainingArguments = field(default_factory=TrainingArguments)
    engine_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for section in self.sections():
            check_with = getattr(section, "check_with", None)
            if check_with:  # an engine's options' rules with the training arguments (--elastic's, --op adasum's)
                check_with(self.training)
        padded_by = [f"--{name}" for name in ("length_buckets", "pad_to_multiple_of") if getattr(self.data, name)]
        if self.training.padding_free and padded_by:
            raise UsageError(f"--padding_free batches have no padding to shape, so {' and '.join(padded_by)} would "
                             "do nothing", f"drop --padding_free or {' and '.join(padded_by)}")  # fmt: skip

    def options(self, kind: type[Options]) -> Options:
        """The run's instance of an engine's options dataclass ``kind`` (config.options(DDPArguments)); its defaults
        where the run was given none (a RunConfig built without parsing.py's sections)."""
        given = [section for section in self.engine_options.values() if type(section) is kind]
        return given[0] if given else kind()

    def sections(self) -> list[Any]:
        """Every section, in the order of --help."""
        return [self.model, self.data, self.training, *self.engine_options.values()]

    def workers_join_running_job(self) -> bool:
        """Workers may join the run while it trains (an engine's section says so: --elastic), so a process's rank
        at its start does not say whether the output directory is its job's to judge."""
        return any(getattr(section, "workers_join", False) for section in self.sections())

    def to_dict(self) -> dict[str, Any]:
        """Every argument by its flag name (the sections share one namespace), as recorded in run_config.json,
        checkpoints and trackers: a --token is never written out."""
        values = {k: v for section in self.sections() for k, v in dataclasses.asdict(section).items()}
        return {**values, "token": "<redacted>"} if values.get("token") else values
