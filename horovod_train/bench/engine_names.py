"""The engines bench names, read from the engines' rows (horovod_train/engines/specs.py) through one function, the
one place in bench that knows where the rows are."""

from __future__ import annotations

from horovod_train.engines.specs import ENGINES


def engine_names(*wanted: str) -> tuple[str, ...]:
    """The rows' engines: ``wanted`` in its order (each must be a row: a renamed or removed engine fails where bench
    names it, at import, not mid-benchmark), else every row in the registry's order."""
    names = wanted or tuple(ENGINES)
    unknown = [name for name in names if name not in ENGINES]
    if unknown:
        raise LookupError(f"bench names {unknown}, which are not engines of the rows {tuple(ENGINES)}")
    return tuple(names)
