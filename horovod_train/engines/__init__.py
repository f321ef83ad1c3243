"""The engines, by ``--engine`` name. Adding an engine is adding an ``Engine`` subclass and a row here."""

from __future__ import annotations

from horovod_train.config import RunConfig
from horovod_train.engines.base import Engine
from horovod_train.engines.ddp import DDPEngine
from horovod_train.engines.dp import DataParallelEngine
from horovod_train.engines.horovod import HorovodEngine
from horovod_train.engines.single import SingleEngine
from horovod_train.errors import UsageError

__all__ = ["ENGINES", "Engine", "available_engines", "create_engine"]

ENGINES: dict[str, type[Engine]] = {
    engine.name: engine for engine in (DDPEngine, DataParallelEngine, HorovodEngine, SingleEngine)
}


def available_engines() -> dict[str, type[Engine]]:
    return dict(ENGINES)


def create_engine(config: RunConfig) -> Engine:
    engine = config.training.engine
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}", f"use --engine {' or '.join(ENGINES)}")
    return ENGINES[engine](config)
