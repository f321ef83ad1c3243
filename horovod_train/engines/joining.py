"""Which engines join which launcher's world: the engine rows (specs.py) read against the launcher table
(horovod_train/launching). An engine's ranks meet through its row's launcher's rendezvous, so they run under every
launcher whose world offers it; a launcher implies the first row that meets through its own (doctor). Here, above
both tables: launching/ imports no engine row (the rows import the engines, and the engines the launcher table)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from horovod_train.common.errors import UsageError
from horovod_train.config.domains import check_environment
from horovod_train.engines.specs import ENGINES, names, spec_of
from horovod_train.launching import Launcher, environment, launcher


def meets_through(engine: str) -> str:
    """The rendezvous ``engine``'s ranks meet through: its row's launcher's."""
    return launcher(spec_of(engine).launcher).rendezvous


def check_joins(engine: str, env: Mapping[str, str] | None = None) -> None:
    """The world this process's launcher started can be joined by ``engine`` (environment.check_joins, every row's
    engine named in the fix where it would join)."""
    spec_of(engine)
    environment.check_joins(engine, {name: meets_through(name) for name in names()}, env)


def check_launch(engine: str, env: Mapping[str, str] | None = None) -> None:
    """Before ``engine`` starts in this process: the environment's variables in their domains (domains.VARIABLES),
    then the world its launcher started one ``engine`` can join."""
    env = os.environ if env is None else env
    check_environment(env)
    check_joins(engine, env)


def implied_engine(row: Launcher) -> str:
    """The engine ``row``'s processes join with where none is named (doctor): the first engine row that meets through
    the launcher's own rendezvous and is installed here, else one that meets through another it offers (mpirun
    without Horovod: ddp), else the first that meets through its own."""
    installed = [name for name, spec in ENGINES.items() if spec.installed()]
    tries = ((installed, (row.rendezvous,)), (installed, row.every_rendezvous()), (list(ENGINES), (row.rendezvous,)))
    for engines, offered in tries:
        found = [name for name in engines if meets_through(name) in offered]
        if found:
            return found[0]
    raise UsageError(f"no engine meets through {row.rendezvous}", f"add an engine row whose launcher is {row.name}")
