"""torch.distributed's env:// rendezvous, said while it waits: the process group of the engines built on it (ddp,
zero1, fsdp: process_group.py).

torch's own env:// waits silently for every rank until --ddp_timeout (30 minutes), then ends in a traceback
(``DistStoreError ... 1/2 clients joined``): what a shell that still holds RANK/WORLD_SIZE/MASTER_ADDR from an
earlier torchrun, or a hand-started job whose peer never comes, looked like. Here rank 0 hosts the same store torch
would (a multi-tenant TCPStore at MASTER_ADDR:MASTER_PORT), every rank checks in, and rank 0 says after a few
seconds how many ranks it still waits for; the wait ends at --ddp_timeout in one line (a UsageError). A rank other
than 0 says it waits only when nothing answers at rank 0's address (rank 0 is not there to say it).

Under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE) the agent has gathered every worker before any starts,
so torch's own env:// is used and only its timeout is turned into one line.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from horovod_train.common.console import write_line
from horovod_train.common.errors import UsageError
from horovod_train.launching.environment import DistEnv

JOINED_KEY = "horovod_train/joined"
# A healthy job's ranks meet within a second or two of each other; after this rank 0 says whom it waits for,
# and again every REPEAT_S while the count stays short.
FIRST_WORD_S = 5.0
REPEAT_S = 60.0
POLL_S = 0.1


def init_process_group(env: DistEnv, backend: str, timeout: timedelta, left_over: list[str], **options: Any) -> None:
    """Join ``env``'s world over env:// (``env.export()`` has set its variables), saying what it waits for;
    ``left_over``: the rank variables the environment held that its launcher did not set (``Launcher.left_over``,
    read before ``export``), named while it waits."""
    where = Place(f"{env.master_addr}:{env.master_port} (env://)", left_over, env.launcher)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        with one_line_on_timeout(env, where, timeout):
            dist.init_process_group(backend, init_method="env://", timeout=timeout, **options)
        return
    with one_line_on_timeout(env, where, timeout):
        store = meet(env, where, timeout)
    dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout, **options)


def meet(env: DistEnv, where: Place, timeout: timedelta) -> dist.TCPStore:
    """Every rank connected to rank 0's store and checked in; rank 0 says who is missing while it waits."""
    deadline = time.monotonic() + timeout.total_seconds()
    addr, port = env.master_addr, env.master_port
    if env.rank != 0:
        with saying_after(FIRST_WORD_S, lambda: nothing_answers(env, where)):
            store = dist.TCPStore(addr, port, env.world_size, False, timeout, wait_for_workers=False)
        store.add(JOINED_KEY, 1)
        return store
    store = dist.TCPStore(addr, port, env.world_size, True, timeout, wait_for_workers=False, multi_tenant=True)
    joined = store.add(JOINED_KEY, 1)
    next_word = time.monotonic() + FIRST_WORD_S
    while joined < env.world_size:
        now = time.monotonic()
        if now >= deadline:
            raise never_joined(env, where, joined, timeout)
        if now >= next_word:
            write_line(f"waiting for {env.world_size - joined} of {env.world_size} ranks at {where}, up to "
                       f"--ddp_timeout {timeout.total_seconds():.0f} s{where.hint()}", sys.stderr)  # fmt: skip
            next_word = now + REPEAT_S
        time.sleep(POLL_S)
        joined = store.add(JOINED_KEY, 0)
    return store


@contextlib.contextmanager
def one_line_on_timeout(env: DistEnv, where: Place, timeout: timedelta) -> Iterator[None]:
    """torch's rendezvous errors (a rank 0 that never answered, clients that never came) as one line."""
    try:
        yield
    except dist.DistStoreError as error:
        raise never_joined(env, where, None, timeout) from error
    except dist.DistNetworkError as error:
        if "timed out" not in str(error):
            raise  # an address in use or unreachable: torch's message names it
        raise UsageError(
            f"rank {env.rank} found no rank 0 at {where} within --ddp_timeout {timeout.total_seconds():.0f} s",
            f"start rank 0 of the job at MASTER_ADDR{where.fix()}",
        ) from None


def never_joined(env: DistEnv, where: Place, joined: int | None, timeout: timedelta) -> UsageError:
    missing = "some" if joined is None else str(env.world_size - joined)
    return UsageError(
        f"{missing} of {env.world_size} ranks never joined at {where} within --ddp_timeout "
        f"{timeout.total_seconds():.0f} s",
        f"start the missing ranks with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE{where.fix()}",
    )


@dataclass(frozen=True)
class Place:
    """Where the ranks meet, and the variables there that look left over from an earlier launch."""

    where: str
    left_over: list[str]
    launcher: str

    def __str__(self) -> str:
        return self.where

    def hint(self) -> str:
        if not self.left_over:
            return ""
        return (f"; {', '.join(self.left_over)} are set, but not by a running {self.launcher}: if they are left over "
                f"from an earlier one, stop this (Ctrl-C) and `unset {' '.join(self.left_over)}`")  # fmt: skip

    def fix(self) -> str:
        if not self.left_over:
            return ""
        return f", or, if they are left over from an earlier {self.launcher}, `unset {' '.join(self.left_over)}`"


def nothing_answers(env: DistEnv, where: Place) -> None:
    """A rank other than 0 waiting to connect: said only where nothing listens at rank 0's address."""
    try:
        socket.create_connection((env.master_addr, env.master_port), timeout=1).close()
    except OSError:
        write_line(f"rank {env.rank}: waiting for rank 0 at {where}: nothing answers there yet", sys.stderr)


@contextlib.contextmanager
def saying_after(delay_s: float, say: Callable[[], None]) -> Iterator[None]:
    """Run ``say`` once, ``delay_s`` into the block, unless the block has ended."""
    timer = threading.Timer(delay_s, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
