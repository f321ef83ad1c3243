"""The engines, by ``--engine`` name. Adding an engine is adding an ``Engine`` subclass and a row here.

The engine classes are imported on first use (module ``__getattr__``): config.py imports the engines'
option modules (engines/horovod/options.py, engines/ddp_options.py), and the engines import config.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from horovod_train.errors import UsageError

if TYPE_CHECKING:
    from horovod_train.config import RunConfig
    from horovod_train.engines.base import Engine

__all__ = ["ENGINES", "Engine", "available_engines", "create_engine"]


@functools.cache
def _registry() -> dict[str, type[Engine]]:
    from horovod_train.engines.ddp import DDPEngine
    from horovod_train.engines.dp import DataParallelEngine
    from horovod_train.engines.fsdp import FSDPEngine
    from horovod_train.engines.horovod import HorovodEngine
    from horovod_train.engines.single import SingleEngine
    from horovod_train.engines.zero1 import Zero1Engine

    engines = (DDPEngine, DataParallelEngine, FSDPEngine, HorovodEngine, SingleEngine, Zero1Engine)
    return {engine.name: engine for engine in engines}


def __getattr__(name: str) -> Any:
    if name == "ENGINES":
        return _registry()
    if name == "Engine":
        from horovod_train.engines.base import Engine

        return Engine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def available_engines() -> dict[str, type[Engine]]:
    return dict(_registry())


def create_engine(config: RunConfig) -> Engine:
    engine, engines = config.training.engine, _registry()
    if engine not in engines:
        raise UsageError(f"unknown engine {engine!r}", f"use --engine {' or '.join(engines)}")
    return engines[engine](config)
