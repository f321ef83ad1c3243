"""``--engine horovod``'s options, read by the Horovod engine alone, and their rules (config.py adds them
to train's arguments: this module imports no engine, so config can import it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from horovod_train.common.errors import UsageError
from horovod_train.config.domains import (
    Number,
    boolean,
    check_section,
    count,
    one_of,
    writable_file,
)

if TYPE_CHECKING:
    from horovod_train.config.run_config import TrainingArguments

Compression = Literal["none", "fp16"]
ReduceOp = Literal["average", "adasum"]


@dataclass
class HorovodArguments:
    """Read by --engine horovod only."""

    _argument_group_name = "--engine horovod arguments"

    scale_lr: bool = field(
        default=False, metadata={"help": "Multiply the learning rate by the world size.", "domain": boolean}
    )
    compression: Compression = field(
        default="none", metadata={"help": "Gradient compression.", "domain": one_of(Compression)}
    )
    op: ReduceOp = field(default="average", metadata={"help": "Gradient reduction.", "domain": one_of(ReduceOp)})
    gradient_predivide_factor: float = field(
        default=1.0,
        metadata={
            "help": "Divide gradients by this before the sum and by size/this after it.",
            "domain": Number(0.0, low_open=True, example="1.0"),
        },
    )
    # Not --timeline: horovodrun's parser would reject it as an ambiguous prefix of its own --timeline-* options.
    horovod_timeline: str | None = field(
        default=None, metadata={"help": "Horovod timeline (HOROVOD_TIMELINE).", "domain": writable_file}
    )
    autotune: bool = field(
        default=False, metadata={"help": "Horovod autotuning (HOROVOD_AUTOTUNE=1).", "domain": boolean}
    )
    autotune_log: str | None = field(
        default=None, metadata={"help": "Horovod autotune log (HOROVOD_AUTOTUNE_LOG).", "domain": writable_file}
    )
    horovod_groups: int | None = field(
        default=None,
        metadata={
            "help": "hvd.DistributedOptimizer gradient groups, 0: per tensor (default: on CPU buckets of "
            "--horovod_group_mb, on GPU per tensor).",
            "domain": count(0, example="1"),
        },
    )
    horovod_group_mb: float | None = field(
        default=None,
        metadata={
            "help": "On CPU, group the gradients into buckets of at most this many MiB, in backward order, "
            "each all-reduced once its gradients are ready (default: 4).",
            "domain": Number(0.0, low_open=True, example="4"),
        },
    )
    # Elastic Horovod (horovodrun --min-np/--max-np --host-discovery-script).
    elastic: bool = field(
        default=False, metadata={"help": "Survive workers leaving and joining (Horovod).", "domain": boolean}
    )
    elastic_commit_steps: int = field(
        default=10, metadata={"help": "Steps between elastic state commits.", "domain": count(1, example="10")}
    )

    def __post_init__(self) -> None:
        check_section(self)
        if self.op == "adasum" and self.gradient_predivide_factor != 1.0:
            raise UsageError("--gradient_predivide_factor only applies to --op average", "drop it or use average")
        if self.autotune_log and not self.autotune:
            raise UsageError("--autotune_log without --autotune", "add --autotune or drop --autotune_log")

    @property
    def workers_join(self) -> bool:
        """Workers join the running job (RunConfig.workers_join_running_job)."""
        return self.elastic

    def grouping_flag(self) -> str | None:
        """The flag that asked for gradient groups explicitly, if any."""
        if self.horovod_groups:
            return "--horovod_groups"
        return "--horovod_group_mb" if self.horovod_group_mb else None

    def check_with(self, training: TrainingArguments) -> None:
        """The rules between these options and the training arguments."""
        if self.op == "adasum" and training.engine == "horovod":
            _check_adasum(training)
        if not self.elastic:
            return
        if training.engine != "horovod":
            raise UsageError(f"--elastic needs --engine horovod (got {training.engine})",
                             "drop --elastic or use horovod")  # fmt: skip
        if training.group_by_length:
            raise UsageError("--group_by_length does not work with --elastic", "drop one of the two flags")
        if flag := self.grouping_flag():  # a joining worker's grouped all-reduce never matches the running ones'
            raise UsageError(f"{flag} does not work with --elastic (a joining worker stalls)",
                             f"drop {flag} (elastic runs all-reduce per tensor)")  # fmt: skip
        # Horovod's autotuner keeps its sample count per process and broadcasts new parameters from rank 0
        # when its count is due: a joining worker's fresh count never matches, rank 0 waits in a broadcast
        # the other never makes, and Gloo gives up after 30 s (the job shrinks back; docs/failures.md).
        if self.autotune or os.environ.get("HOROVOD_AUTOTUNE", "").strip().lower() not in ("", "0", "false"):
            raise UsageError("--autotune does not work with --elastic (a joining worker's autotuner is out of step "
                             "with the running workers' and the job times out)",
                             "drop --autotune (and horovodrun's --autotune, HOROVOD_AUTOTUNE) for elastic runs; "
                             "tune a fixed-size run, then set HOROVOD_FUSION_THRESHOLD/HOROVOD_CYCLE_TIME")  # fmt: skip


def _check_adasum(training: TrainingArguments) -> None:
    """Horovod's Adasum optimizer steps each rank's optimizer inside the backward pass (its delta
    optimizer) and combines the updates, so there is no gradient left to clip or unscale afterwards."""
    if training.max_grad_norm > 0:
        raise UsageError(
            f"--op adasum cannot clip gradients (--max_grad_norm {training.max_grad_norm}): it steps "
            "each rank's optimizer inside the backward pass",
            "add --max_grad_norm 0, or use --op average",
        )
    if training.fp16:
        raise UsageError(
            "--op adasum cannot use --fp16's loss scaling: it steps inside the backward pass, "
            "before the gradients could be unscaled",
            "use --bf16, or --op average",
        )
