"""The engines, by ``--engine`` name: their rows (specs.py) and the engine a run asks for.

An engine's class is imported when a run asks for it: reading the rows imports no engine (config.py reads the
options sections from them, and the engines import config).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from horovod_train.engines.specs import ENGINES, EngineSpec, names, spec_of

if TYPE_CHECKING:
    from horovod_train.config.run_config import RunConfig
    from horovod_train.engines.base import Engine

__all__ = ["ENGINES", "EngineSpec", "available_engines", "create_engine", "spec_of"]


def available_engines() -> dict[str, type[Engine]]:
    """Every row's class, in --engine's order (imports them all)."""
    return {name: ENGINES[name].engine() for name in names()}


def create_engine(config: RunConfig) -> Engine:
    """The engine the run asks for, its module alone imported: every rank of every run starts here, and the other
    engines' imports (zero1's torch.distributed.optim scripts its functional optimizers) cost a second each."""
    return spec_of(config.training.engine).engine()(config)
