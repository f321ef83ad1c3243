"""Engine registry. Adding an engine is adding a module here that defines an ``Engine`` subclass
with a ``name``; nothing else needs to change."""

from __future__ import annotations

import importlib
import pkgutil

from horovod_train.config import TrainingArguments
from horovod_train.engines.base import Engine
from horovod_train.errors import UsageError

__all__ = ["Engine", "available_engines", "create_engine"]


def available_engines() -> dict[str, type[Engine]]:
    found: dict[str, type[Engine]] = {}
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Engine) and obj.name:
                found[obj.name] = obj
    return dict(sorted(found.items()))


def create_engine(args: TrainingArguments) -> Engine:
    engines = available_engines()
    if args.engine not in engines:
        raise UsageError(f"unknown engine {args.engine!r}", f"use --engine {' or '.join(engines)}")
    return engines[args.engine](args)
