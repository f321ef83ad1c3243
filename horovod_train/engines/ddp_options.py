"""``--engine ddp``'s options, read by the DDP engine (engines/ddp.py) alone. This module imports no
engine, so config.py can add them to train's arguments."""

from __future__ import annotations

from dataclasses import dataclass, field

from horovod_train.domains import DDPBackend, check_section


@dataclass
class DDPArguments:
    """Read by --engine ddp only."""

    _argument_group_name = "--engine ddp arguments"

    ddp_bucket_cap_mb: int = field(default=25, metadata={"help": "DDP gradient bucket size in MiB."})
    ddp_backend: DDPBackend = field(default="auto", metadata={"help": "auto: NCCL on GPUs, else Gloo."})
    ddp_find_unused_parameters: bool = field(
        default=False, metadata={"help": "Let DDP find parameters that get no gradient (slower; some models need it)."}
    )

    def __post_init__(self) -> None:
        check_section(self)
