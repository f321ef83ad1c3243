"""PyTorch DistributedDataParallel: one process per device, NCCL on GPUs and Gloo on CPUs (or, with
--ddp_backend gloo, on GPUs: CUDA tensors through host memory, so ranks may share a GPU).

Starts under torchrun, mpirun or srun: horovod_train.launching.environment turns each launcher's variables
into the MASTER_ADDR/RANK/WORLD_SIZE that ``init_process_group("env://")`` reads.
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
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from horovod_train import launching
from horovod_train.common.console import write_line
from horovod_train.common.errors import UsageError
from horovod_train.engines.base import Engine
from horovod_train.launching import environment
from horovod_train.launching.environment import DistEnv

if TYPE_CHECKING:
    from horovod_train.config.run_config import RunConfig


class DDPEngine(Engine):
    name = "ddp"
    launcher = "plain"
    backend = "gloo"

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.options = config.ddp
        if self.options.ddp_bucket_cap_mb <= 0:
            raise UsageError(f"--ddp_bucket_cap_mb must be > 0 (got {self.options.ddp_bucket_cap_mb})", "pass e.g. 25")
        self.wrapped: DistributedDataParallel | None = None  # released before the process group (shutdown)

    def setup(self) -> None:
        env = environment.detect()
        left_over = launching.launcher(env.launcher).left_over(os.environ)  # before export sets them all
        env.export()
        self.launcher = env.launcher
        self.local_rank, self.local_world_size = env.local_rank, env.local_world_size
        options: dict[str, Any] = {}
        cuda = torch.cuda.is_available()
        self.backend = self.options.backend_on(cuda)
        if cuda:  # by local rank (global ranks exceed a node's GPUs), or the task's only GPU
            self.device, self.device_rule = environment.pin_cuda_device(env.local_rank)
        if self.backend == "nccl":
            options["device_id"] = self.device
        # --ddp_timeout: long enough for rank 0's one-sided work (writing a checkpoint) while the others wait.
        timeout = timedelta(seconds=self.training.ddp_timeout)
        init_process_group(env, self.backend, timeout, left_over, **options)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.set_cpu_threads()

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        model.to(self.device)  # in place: the optimizer's parameters stay the same objects
        wrapped = DistributedDataParallel(
            model,  # the constructor broadcasts rank 0's parameters and buffers
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            bucket_cap_mb=self.options.ddp_bucket_cap_mb,
            gradient_as_bucket_view=True,
            find_unused_parameters=self.options.ddp_find_unused_parameters,
        )
        self.wrapped = wrapped
        return wrapped, optimizer

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def accumulation_context(self, model: nn.Module, is_last_micro_step: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if is_last_micro_step else model.no_sync()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.all_reduce_sum_async(tensor)()

    def all_reduce_sum_async(self, tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        if self.device.type == "cuda" and tensor.device.type == "cpu":
            return self.all_reduce_sum_on_gpu(tensor)
        summed = tensor.to(self.device, copy=True)
        work = dist.all_reduce(summed, op=dist.ReduceOp.SUM, async_op=True)
        return lambda: (work.wait(), summed.to(tensor.device))[1]

    def all_reduce_sum_on_gpu(self, tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        """NCCL sums GPU memory only. Both copies are queued on the stream from pinned memory and the host
        waits for neither: the result is read through an event recorded after the copy back, which the
        GPU has passed by the time it is read a step later (the stop flags), so the host never waits for
        the step in flight. A pageable copy (``tensor.to(device)`` and back) waits for the whole stream."""
        staged = tensor.pin_memory().to(self.device, non_blocking=True)
        work = dist.all_reduce(staged, op=dist.ReduceOp.SUM, async_op=True)
        work.wait()  # NCCL: the current stream waits for the all-reduce, the host does not
        result = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        result.copy_(staged, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return lambda: (copied.synchronize(), result)[1]

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """torch.distributed gathers equal shapes only: pad every rank to the longest, gather, trim."""
        local = tensor.to(self.device)
        length = torch.tensor([local.shape[0]], dtype=torch.int64, device=self.device)
        lengths = [torch.empty_like(length) for _ in range(self.world_size)]
        dist.all_gather(lengths, length)
        sizes = [int(n) for n in lengths]
        padded = local.new_zeros((max(sizes), *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded)
        return torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)]).to(tensor.device)

    def broadcast_(self, tensor: torch.Tensor) -> None:
        staged = tensor.to(self.device)  # NCCL sends GPU memory only: a chunk at a time passes through it
        dist.broadcast(staged, src=0)
        if staged is not tensor:
            tensor.copy_(staged)

    def barrier(self) -> None:
        dist.barrier()

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "launcher": self.launcher,
            "backend": self.backend,
            "ddp_bucket_cap_mb": self.options.ddp_bucket_cap_mb,
        }

    def shutdown(self) -> None:
        if self.wrapped is not None:
            release_reducer(self.wrapped)
            self.wrapped = None
        if dist.is_initialized():
            dist.destroy_process_group()


def release_reducer(model: DistributedDataParallel) -> None:
    """Free DDP's reducer while the process group is still registered. The reducer holds the group: freed after
    ``destroy_process_group`` (when the caller's last reference to the model goes), it destroys the Gloo group
    itself, joining the group's worker threads while holding the GIL, and a worker that is still freeing a finished
    all-reduce needs the GIL for it (a Python object in the work's thread-local state): a deadlock after the last
    step, seen about one run in three with --ddp_find_unused_parameters. Freed here, the reducer leaves the group to
    ``destroy_process_group``, whose binding releases the GIL while the threads stop."""
    model.logger = None  # the logger holds the reducer too
    model.reducer = None


# torch.distributed's env:// rendezvous, said while it waits: the DDP engines' process group (ddp, fsdp, zero1).
#
# torch's own env:// waits silently for every rank until --ddp_timeout (30 minutes), then ends in a traceback
# (``DistStoreError ... 1/2 clients joined``): what a shell that still holds RANK/WORLD_SIZE/MASTER_ADDR from an
# earlier torchrun, or a hand-started job whose peer never comes, looked like. Here rank 0 hosts the same store torch
# would (a multi-tenant TCPStore at MASTER_ADDR:MASTER_PORT), every rank checks in, and rank 0 says after a few
# seconds how many ranks it still waits for; the wait ends at --ddp_timeout in one line (a UsageError). A rank other
# than 0 says it waits only when nothing answers at rank 0's address (rank 0 is not there to say it).
#
# Under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE) the agent has gathered every worker before any starts,
# so torch's own env:// is used and only its timeout is turned into one line.
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
