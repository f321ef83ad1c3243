"""``--engine fsdp``'s options, read by the FSDP engine (engines/fsdp.py) alone. This module imports no engine,
so config.py can add them to train's arguments."""

from __future__ import annotations

from dataclasses import dataclass, field

from horovod_train.config.domains import boolean, check_section, count


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

    fsdp_replicate_degree: int = field(
        default=0,
        metadata={
            "help": "HSDP: this many replicas, each sharding the state over world/degree ranks (torchtitan's "
            "data_parallel_replicate_degree); 1: shard over the whole world; 0: one replica per node when the job "
            "spans several nodes of 2+ ranks each, else 1. Must divide the world size.",
            "domain": count(0, example="2"),
        },
    )

    def __post_init__(self) -> None:
        check_section(self)
