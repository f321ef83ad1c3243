"""The engines bench names, read from the engines' rows (horovod_train/engines/specs.py) through one module, the
one place in bench that knows where the rows are: by name, by their memory model's part (engines/memory.py) or
their communication part (engines/communication.py)."""

from __future__ import annotations

from horovod_train.engines.communication import Communication
from horovod_train.engines.memory import Replicated
from horovod_train.engines.specs import ENGINES, reference_engine

__all__ = ["communications", "engine_names", "memory_of", "process_per_rank", "reference_engine", "whole_state_engines"]


def engine_names(*wanted: str) -> tuple[str, ...]:
    """The rows' engines: ``wanted`` in its order (each must be a row: a renamed or removed engine fails where bench
    names it, at import, not mid-benchmark), else every row in the registry's order."""
    names = wanted or tuple(ENGINES)
    unknown = [name for name in names if name not in ENGINES]
    if unknown:
        raise LookupError(f"bench names {unknown}, which are not engines of the rows {tuple(ENGINES)}")
    return tuple(names)


def memory_of(engine: str) -> type[Replicated]:
    """``engine``'s part of the memory model."""
    return ENGINES[engine].memory


def process_per_rank(engine: str) -> bool:
    """``engine``'s processes are one rank each (not dp's one process driving every device)."""
    return ENGINES[engine].process_per_rank


def whole_state_engines() -> tuple[str, ...]:
    """The engines whose every rank holds the whole training state, in the registry's order."""
    return tuple(name for name, spec in ENGINES.items() if spec.memory.whole_state)


def communications() -> dict[str, Communication]:
    """The runs whose communication `bench project` models, by name: each row's with a communication part, and
    each of its variants that changes train's arguments, as those make it, named without the machine's backend
    (fsdp-zero2)."""
    parts: dict[str, Communication] = {}
    for name, spec in ENGINES.items():
        if spec.communication is None:
            continue
        parts[name] = spec.communication
        for variant in spec.variants:
            if variant.args:
                parts[variant.name.removesuffix("-{backend}")] = spec.communication.under(variant.args)
    return parts
