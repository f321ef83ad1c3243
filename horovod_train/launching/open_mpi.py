"""Open MPI's flags, as the mpirun row writes them and horovodrun passes them to the mpirun it runs.

The flag set, everywhere mpirun runs (launch/mpirun.sh, compare, bench, the tests): Horovod's documented flags
(mpirun_flags.txt, shipped in the wheel) followed by ``-gmca btl ^openib,ofi``. Open MPI 4.1's libfabric BTL (ofi),
which the documented ``-mca btl ^openib`` leaves loaded, made 6 of 28 runs between two containers start with TCP
round trips of 8-16 ms or 300 us instead of 30 us (0 of 22 with it excluded; docs/launch.md,
scripts/bench_containers.py), and Horovod's MPI controller pays a round trip several times a step. Over Ethernet and
shared memory nothing is lost: Open MPI's own TCP and vader BTLs carry the traffic. ``-gmca`` because Open MPI refuses
a second ``-mca btl`` and horovodrun always passes the documented one; the later ``-gmca`` value wins. (The tests used
``--mca btl self,tcp``, which also drops shared memory between local ranks; the documented set with ofi excluded is
what launch/mpirun.sh and docs/launch.md promise and what the launch tests check.)
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

MPIRUN_FLAGS_FILE = Path(__file__).with_name("mpirun_flags.txt")
# Open MPI's libfabric BTL excluded on top of the documented `^openib` (see the module docstring).
BTL_WITHOUT_OFI = ["-gmca", "btl", "^openib,ofi"]
# Runs on one machine sharing its cores: more ranks than cores may start, and idle ranks yield instead of busy-polling.
OVERSUBSCRIBE = ["--oversubscribe"]
YIELD_WHEN_IDLE = ["-mca", "mpi_yield_when_idle", "1"]
# mpirun starts remote ranks with its own environment, so variables reach them only when named with -x:
# always PATH (and NCCL_DEBUG, LD_LIBRARY_PATH when set), and every set variable whose name matches.
MPI_FORWARD_FIRST = ("NCCL_DEBUG", "PATH", "LD_LIBRARY_PATH")
MPI_FORWARD_PATTERN = re.compile(r"^(HOROVOD_|NCCL_|HF_|TRANSFORMERS_|PYTHON|OMP_NUM_THREADS$)")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(=.*)?$")


def running_as_root() -> bool:
    return os.geteuid() == 0


def documented_mpirun_flags() -> list[str]:
    """Horovod's documented Open MPI flags ("Run Horovod with Open MPI"), from mpirun_flags.txt."""
    lines = (line.strip() for line in MPIRUN_FLAGS_FILE.read_text().splitlines())
    return [word for line in lines if line and not line.startswith("#") for word in line.split()]


def mpirun_flags(exclude_ofi: bool = True) -> list[str]:
    """The flag set of every mpirun; ``exclude_ofi=False`` only to measure what it was before (bench_containers)."""
    return [*documented_mpirun_flags(), *(BTL_WITHOUT_OFI if exclude_ofi else [])]


def mpi_forwarded(env: Mapping[str, str], extra: Sequence[str] = ()) -> list[str]:
    """``-x NAME`` for each variable the ranks need (``extra``: the user's ``VAR`` or ``VAR=value`` first)."""
    names = list(dict.fromkeys(extra))
    names += [name for name in MPI_FORWARD_FIRST if name in env or name == "PATH"]
    names += sorted(name for name in env if MPI_FORWARD_PATTERN.match(name))
    return [arg for name in dict.fromkeys(names) for arg in ("-x", name)]


def ssh_command_words(port: int | None, identity_file: str | None) -> str:
    """``-p PORT -i KEY`` for Open MPI's plm_rsh_args, which it splits at whitespace (the scripts refuse keys with
    spaces)."""
    return " ".join([*(["-p", str(port)] if port else []), *(["-i", identity_file] if identity_file else [])])


def interface_options(interfaces: str) -> list[str]:
    """Open MPI's traffic (its TCP BTL and its out-of-band channel) on these network interfaces only."""
    return [word for name in ("btl_tcp_if_include", "oob_tcp_if_include") for word in ("-mca", name, interfaces)]


def env_assignment(text: str) -> str:
    """An argparse type: ``VAR`` or ``VAR=value``, for ``-x``."""
    if not ENV_NAME.match(text):
        raise argparse.ArgumentTypeError(f"{text} is not VAR or VAR=value")
    return text
