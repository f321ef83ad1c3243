"""How an engine's gradient reduction is scheduled against the backward pass: the part of its row
(``EngineSpec.communication``, engines/specs.py) that `bench project` models (bench/models/project.py), one part per
schedule. A part names the schedule only; its sizes (the fusion threshold and cycle time, the bucket cap, the units)
are the projection's arguments. A row without one (single, dp: no collective between processes) is not projected.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Communication:
    """A schedule of the gradients' reduction."""

    def under(self, args: tuple[str, ...]) -> Communication:
        """The schedule of a variant run with train's ``args`` (engines/specs.py's Variant.args): this one."""
        return self


@dataclass(frozen=True)
class FusionCycle(Communication):
    """Horovod's: a background thread wakes every cycle time and all-reduces the gradients that became ready since,
    fused into one buffer up to the fusion threshold per operation."""


@dataclass(frozen=True)
class Buckets(Communication):
    """DDP's: gradients in fixed buckets (reverse parameter order), each all-reduced once its last gradient is
    ready. ``gather_after_step``: ZeRO-1's all-gather of the parameters each rank stepped, after the optimizer step,
    which nothing overlaps."""

    gather_after_step: bool = False


@dataclass(frozen=True)
class PerBlock(Communication):
    """FSDP's: the parameters sharded per block; forward all-gathers each block (the next one prefetched), backward
    all-gathers it again (``reshard``, ZeRO-3) and reduce-scatters its gradients."""

    reshard: bool = True

    def under(self, args: tuple[str, ...]) -> Communication:
        """--fsdp_reshard_after_forward false (ZeRO-2): each block's gathered parameters kept for backward."""
        flags = dict(zip(args[::2], args[1::2], strict=False))
        return replace(self, reshard=flags.get("--fsdp_reshard_after_forward", "true") != "false")
