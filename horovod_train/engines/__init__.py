"""The engines, by ``--engine`` name. Adding an engine is adding an ``Engine`` subclass and a row here.

The engine classes are imported on first use, by name (``ENGINE_CLASSES``): config.py imports the engines'
option modules (engines/horovod/options.py, engines/ddp_options.py) and the argument checks (domains.py) the
names, while the engines import config. The Engine interface is engines/base.py.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

from horovod_train.errors import UsageError

if TYPE_CHECKING:
    from horovod_train.config import RunConfig
    from horovod_train.engines.base import Engine

__all__ = ["ENGINES", "ENGINE_NAMES", "available_engines", "create_engine"]

# --engine name -> its class, as "module:Class" (the form of a package's entry point).
ENGINE_CLASSES = {
    "ddp": "horovod_train.engines.ddp:DDPEngine",
    "dp": "horovod_train.engines.dp:DataParallelEngine",
    "horovod": "horovod_train.engines.horovod:HorovodEngine",
    "single": "horovod_train.engines.single:SingleEngine",
}
ENGINE_NAMES = tuple(ENGINE_CLASSES)


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
