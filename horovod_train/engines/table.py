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

# The launcher table's row (horovod_train/launching) that starts an engine's ranks on one machine; an engine with no
# row here runs as one plain python process. compare, bench, the engine contract test and
# launch/slurm/ddp_torchrun.sbatch choose by it. Here and not on the engine classes: a batch script asks before
# its job starts, and importing the engines (torch, transformers) cost it 8 CPU-seconds.
LOCAL_LAUNCHERS = {"ddp": "torchrun", "fsdp": "torchrun", "horovod": "horovodrun", "zero1": "torchrun"}


def local_launcher(engine: str) -> str:
    return LOCAL_LAUNCHERS.get(engine, "plain")


def started_by(launcher: str) -> list[str]:
    """The engines whose ranks ``launcher`` starts on one machine, in the table's order."""
    return [name for name in ENGINE_CLASSES if local_launcher(name) == launcher]


# The module an engine needs beyond torch, which may be missing: Horovod is no pip dependency (it is compiled
# against the environment's torch: horovod-train build-horovod).
ENGINE_NEEDS = {"horovod": "horovod.torch"}


def can_run(engine: str) -> bool:
    """Whether ``engine``'s own module can be imported here (imports it)."""
    needed = ENGINE_NEEDS.get(engine)
    try:
        return needed is None or importlib.import_module(needed) is not None
    except (ImportError, OSError):  # OSError: a Horovod built against another torch fails to load its library
        return False


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
