"""The launcher table: every launcher (horovodrun, mpirun, torchrun, srun, plain python) is one ``Launcher`` row
(base.py) that knows how to recognise its processes, how to write its command line and the rendezvous its ranks
meet through.
The launch/ scripts (through ``python -m horovod_train.launching``), the ranks' own environment (environment.py),
``compare``, ``bench``, ``doctor`` and the tests all read it. Standard library only, but for compare.py: one job
under every engine, each under its launcher, started and summarized (`horovod-train compare`, and bench's runs).

Adding a launcher: a ``Launcher`` subclass in its own module here, and its row in ``LAUNCHERS``.
"""

from __future__ import annotations

from collections.abc import Mapping

from horovod_train.common.errors import UsageError
from horovod_train.launching.base import Launcher
from horovod_train.launching.horovodrun import Horovodrun
from horovod_train.launching.mpirun import Mpirun
from horovod_train.launching.plain import PlainPython
from horovod_train.launching.srun import Srun
from horovod_train.launching.torchrun import Torchrun

# name -> row, in the order detection tries them: torchrun before srun (`srun torchrun`'s workers have both's
# variables), horovodrun before mpirun (`horovodrun --mpi` runs mpirun). Plain python, the fallback, comes last.
LAUNCHERS: dict[str, Launcher] = {row.name: row for row in (Torchrun(), Horovodrun(), Mpirun(), Srun(), PlainPython())}


def launcher(name: str) -> Launcher:
    if name not in LAUNCHERS:
        raise UsageError(f"unknown launcher {name!r}", f"use one of {', '.join(LAUNCHERS)}")
    return LAUNCHERS[name]


def detect_launcher(env: Mapping[str, str]) -> Launcher:
    """The launcher that started a process with ``env``: the first row that recognises it, the fallback last."""
    rows = sorted(LAUNCHERS.values(), key=lambda row: row.fallback)
    return next(row for row in rows if row.detects(env))


def signalled_rank_variables() -> list[str]:
    """A process with one of these (and the job id) may be a training rank a stop signal is for."""
    return [name for row in LAUNCHERS.values() for name in row.signalled]
