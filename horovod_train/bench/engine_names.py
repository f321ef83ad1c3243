"""The engines bench names, read from the engine table (horovod_train/engines/table.py) through one function, the
one place that knows where the table keeps them."""

from __future__ import annotations

from horovod_train.engines import table


def engine_names(*wanted: str) -> tuple[str, ...]:
    """The table's engines: ``wanted`` in its order (each must be a row of the table: a renamed or removed engine
    fails where bench names it, at import, not mid-benchmark), else every row in the table's order."""
    names = wanted or table.ENGINE_NAMES
    unknown = [name for name in names if name not in table.ENGINE_NAMES]
    if unknown:
        raise LookupError(f"bench names {unknown}, which are not engines of the engine table {table.ENGINE_NAMES}")
    return tuple(names)
