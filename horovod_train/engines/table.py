"""The engine table: ``--engine`` name -> the class that implements it, as "module:Class" (the form of a package's
entry point), and the engines' own argument sections. Adding an engine is adding an ``Engine`` subclass
(engines/base.py) and a row here (and a row of ENGINE_SECTIONS if it has options of its own). No engine is
imported here: the argument checks (domains.py) read the names, ``engines.create_engine`` loads a class on first
use, config.py loads the sections."""

from __future__ import annotations

import importlib
from typing import Any

ENGINE_CLASSES = {
    "ddp": "horovod_train.engines.ddp:DDPEngine",
    "dp": "horovod_train.engines.dp:DataParallelEngine",
    "fsdp": "horovod_train.engines.fsdp:FSDPEngine",
    "horovod": "horovod_train.engines.horovod:HorovodEngine",
    "single": "horovod_train.engines.single:SingleEngine",
    "zero1": "horovod_train.engines.zero1:Zero1Engine",
}
ENGINE_NAMES = tuple(ENGINE_CLASSES)

# RunConfig's section (config.py composes them into train's arguments, in this order) -> the options dataclass, in
# a module that imports no engine (config.py imports it; the engines import config). zero1 reads ddp's.
ENGINE_SECTIONS = {
    "horovod": "horovod_train.engines.horovod.options:HorovodArguments",
    "ddp": "horovod_train.engines.ddp_options:DDPArguments",
    "fsdp": "horovod_train.engines.fsdp_options:FSDPArguments",
}


def load(where: str) -> Any:
    """The object a row names: "module:Name"."""
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)
