"""``--engine ddp``'s options, read by the DDP engine (engines/ddp.py) alone. This module imports no
engine, so config.py can add them to train's arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from horovod_train.common.errors import UsageError
from horovod_train.config.domains import boolean, check_section, count, one_of

DDPBackend = Literal["auto", "nccl", "gloo"]


@dataclass
class DDPArguments:
    """Read by --engine ddp only."""

    _argument_group_name = "--engine ddp arguments"

    ddp_bucket_cap_mb: int = field(
        default=25, metadata={"help": "DDP gradient bucket size in MiB.", "domain": count(1, example="25")}
    )
    ddp_backend: DDPBackend = field(
        default="auto",
        metadata={
            "help": "auto: NCCL on GPUs, else Gloo (gloo on GPUs: CUDA tensors via the host).",
            "domain": one_of(DDPBackend),
        },
    )
    ddp_find_unused_parameters: bool = field(
        default=False,
        metadata={
            "help": "Let DDP find parameters that get no gradient (slower; some models need it).",
            "domain": boolean,
        },
    )

    def __post_init__(self) -> None:
        check_section(self)

    def backend_on(self, cuda: bool) -> str:
        """The process group's backend. The device does not depend on it: every engine trains on the GPU when
        CUDA is available (CUDA_VISIBLE_DEVICES= hides them). Gloo all-reduces CUDA tensors through host memory,
        so with --ddp_backend gloo ranks may share a GPU, which NCCL refuses ("Duplicate GPU detected")."""
        if self.ddp_backend == "nccl" and not cuda:
            raise UsageError(
                "--ddp_backend nccl needs CUDA GPUs but this machine has none",
                "use --ddp_backend gloo (or auto) on CPUs",
            )
        if self.ddp_backend == "auto":
            return "nccl" if cuda else "gloo"
        return self.ddp_backend
