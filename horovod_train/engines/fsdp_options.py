"""``--engine fsdp``'s options, read by the FSDP engine (engines/fsdp.py) alone. This module imports no engine,
so config.py can add them to train's arguments."""

from __future__ import annotations

from dataclasses import dataclass, field

from horovod_train.config.domains import boolean, check_section


@dataclass
class FSDPArguments:
    """Read by --engine fsdp only."""

    _argument_group_name = "--engine fsdp arguments"

    fsdp_reshard_after_forward: bool = field(
        default=True,
        metadata={
            "help": "Free each block's gathered parameters after its forward, gather them again for backward (ZeRO-3); "
            "false keeps them until backward (ZeRO-2: more memory, fewer all-gathers).",
            "domain": boolean,
        },
    )

    def __post_init__(self) -> None:
        check_section(self)
