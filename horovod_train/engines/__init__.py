"""The engines, by ``--engine`` name: the table (table.py) and the engine a run asks for.

The engine classes are imported on first use: config.py loads the engines' option sections (the table's
ENGINE_SECTIONS) and the engines import config.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from horovod_train.common.errors import UsageError
from horovod_train.engines.table import ENGINE_CLASSES, ENGINE_NAMES, load

if TYPE_CHECKING:
    from horovod_train.config.run_config import RunConfig
    from horovod_train.engines.base import Engine

__all__ = ["ENGINES", "ENGINE_NAMES", "available_engines", "create_engine"]


@functools.cache
def _registry() -> dict[str, type[Engine]]:
    """The classes loaded so far, by name (a test may put its own in, with monkeypatch)."""
    return {}


def _loaded() -> dict[str, type[Engine]]:
    """Every row of the table as it is now (a row added after import, a test's toy engine, too), loaded once."""
    for name in ENGINE_CLASSES:
        _loaded_one(name)
    return _registry()


def _loaded_one(name: str) -> type[Engine]:
    """The class of one row, loaded once (a class a test put in the registry wins)."""
    registry = _registry()
    if name not in registry:
        registry[name] = _engine_class(ENGINE_CLASSES[name])
    return registry[name]


@functools.cache
def _engine_class(where: str) -> type[Engine]:
    return load(where)


def __getattr__(name: str) -> Any:
    if name == "ENGINES":
        return _loaded()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def available_engines() -> dict[str, type[Engine]]:
    loaded = _loaded()
    return {name: loaded[name] for name in ENGINE_CLASSES}


def create_engine(config: RunConfig) -> Engine:
    """The engine the run asks for, its module alone imported: every rank of every run starts here, and the other
    engines' imports (zero1's torch.distributed.optim scripts its functional optimizers) cost a second each."""
    engine = config.training.engine
    if engine not in ENGINE_CLASSES:
        raise UsageError(f"unknown engine {engine!r}", f"use --engine {' or '.join(ENGINE_CLASSES)}")
    return _loaded_one(engine)(config)
