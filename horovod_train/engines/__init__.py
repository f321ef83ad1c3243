"""The engines, by ``--engine`` name: the table (table.py) and the engine a run asks for.

The engine classes are imported on first use: config.py imports the engines' option modules
(engines/horovod/options.py, engines/ddp_options.py) and the engines import config.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

from horovod_train.engines.table import ENGINE_CLASSES, ENGINE_NAMES
from horovod_train.errors import UsageError

if TYPE_CHECKING:
    from horovod_train.config import RunConfig
    from horovod_train.engines.base import Engine

__all__ = ["ENGINES", "ENGINE_NAMES", "available_engines", "create_engine"]


@functools.cache
def _registry() -> dict[str, type[Engine]]:
    return {name: _engine_class(where) for name, where in ENGINE_CLASSES.items()}


def _engine_class(where: str) -> type[Engine]:
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


def __getattr__(name: str) -> Any:
    if name == "ENGINES":
        return _registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def available_engines() -> dict[str, type[Engine]]:
    return dict(_registry())


def create_engine(config: RunConfig) -> Engine:
    engine = config.training.engine
    if engine not in ENGINE_CLASSES:
        raise UsageError(f"unknown engine {engine!r}", f"use --engine {' or '.join(ENGINE_NAMES)}")
    return _registry()[engine](config)
