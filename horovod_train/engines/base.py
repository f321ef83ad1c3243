"""The engine interface: everything the trainer needs from a data-parallel backend, and nothing more.

An engine owns process setup, device placement, model/optimizer wrapping, the gradient step and the
collectives used for metrics. The trainer calls only these methods, so it knows nothing of Horovod,
torch.distributed or DataParallel.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from torch import nn
from torch.optim import Optimizer

from horovod_train.engines import state_io
from horovod_train.engines.checkpoint_io import WholeState
from horovod_train.engines.payload import broadcast_from_root
from horovod_train.engines.policy import RunPolicy
from horovod_train.engines.state_io import BackgroundWrite
from horovod_train.training import amp

if TYPE_CHECKING:
    from horovod_train.config.run_config import RunConfig

T = TypeVar("T")


def clip_gradient(
    parameters: Iterator[nn.Parameter],
    max_grad_norm: float,
    whole: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The norm of the whole gradient of ``parameters`` before clipping (HF's Trainer logs it as grad_norm), a
    0-d tensor on the gradients' device: computed at every step, read at log lines only (no host sync); the
    gradient clipped to ``max_grad_norm`` where it is > 0 (clip_grad_norm_'s two halves). ``whole``: the
    norm of every rank's shards combined (FSDP's DTensor)."""
    parameters = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
    norm = whole(norm) if whole is not None else norm
    if max_grad_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(parameters, max_grad_norm, norm)
    return norm


class Engine(ABC):
    """Replicated engines (single, dp, horovod, ddp) hold the whole model, its gradients and the optimizer's state
    on every rank; a sharded engine (zero1: the optimizer's state; fsdp: all three) is assembled from other parts:
    its state-I/O part (``checkpoint_io``) here, its memory model in its row (specs.py's ``memory``), its parallelize
    part and mesh in process_group.py."""

    name: str = ""
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")
    device_rule: str = "cpu"  # how the device was chosen: a key of launching.environment.DEVICE_RULES
    # False where a worker may run the trainer's setup alone (elastic Horovod adds workers to a running job):
    # setup then uses no collective.
    collective_setup: bool = True

    def __init__(self, config: RunConfig) -> None:
        self.training = config.training

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0

    @abstractmethod
    def setup(self) -> None:
        """Join the job and pick this process's device."""

    def set_cpu_threads(self) -> None:
        """Share the node's cores between its ranks instead of oversubscribing them."""
        if self.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.local_world_size))

    def effective_learning_rate(self, learning_rate: float) -> float:
        return learning_rate

    @abstractmethod
    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Make model and optimizer data-parallel and identical on every rank."""

    def prepare(
        self, model: nn.Module, build_optimizer: Callable[[nn.Module], Optimizer]
    ) -> tuple[nn.Module, Optimizer]:
        """The trained model and its optimizer: ``build_optimizer`` over the model's parameters, before wrapping
        (replicated engines) or after it (a sharded engine's optimizer steps its own shards)."""
        return self.wrap(model, build_optimizer(model))

    @property
    def builds_model_on_meta(self) -> bool:
        """True where this rank builds only the model's shape (the meta device) for ``prepare`` to fill: fsdp's ranks
        but 0, whose shards come from rank 0's model. Elsewhere every rank builds the whole model."""
        return False

    def train_sampler(self, dataset: Any, seed: int) -> Any:
        """A sampler with begin_epoch/record_step (see data.ResumableDistributedSampler); None: that one."""
        return None

    def policy(
        self, model: nn.Module, optimizer: Optimizer, sampler: Any, train_examples: int, scaler: Any = None
    ) -> RunPolicy:
        """How the loop runs, ends, places the learning rate and commits (fixed world size: RunPolicy).
        ``scaler``: fp16's GradScaler, part of the state a policy commits (elastic), or None."""
        return RunPolicy()

    def step_examples(self, per_rank: int) -> int | None:
        """Examples one optimizer step trains on over all ranks (``per_rank`` each); None where it varies
        and the data is re-sharded by examples seen (elastic), so a checkpoint resumes at any world size."""
        return per_rank * self.world_size

    def joins_running_job(self, recorded: dict[str, Any]) -> bool:
        """True for a worker added to a running job (elastic), which must leave the run directory as it is;
        ``recorded``: the configuration the run directory holds ({} where none: RunDirectory.read_config)."""
        return False

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    # ---- the model's state, however it is spread over the ranks: the state-I/O part (checkpoint_io.py) ---------
    # The trainer, its checkpoints, evaluation and results call these instead of reading the model or the optimizer.
    checkpoint_io: ClassVar[type[WholeState]] = WholeState

    @functools.cached_property
    def checkpointing(self) -> WholeState:
        return self.checkpoint_io(self)

    @property
    def sharded_state(self) -> bool:
        """True where every rank writes and reads its own part of a checkpoint's model and optimizer state
        (state_io); False: rank 0 writes the state gathered by the methods below, and reads it for every rank."""
        return self.checkpoint_io.sharded

    def full_model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Collective: the whole model's state dict on rank 0 (for ``save_pretrained`` and checkpoints), {} on the
        others. A replicated engine's are the model's own tensors, not copies."""
        return self.checkpointing.full_model_state(model)

    def write_model_shards(self, model: nn.Module, directory: Path, max_shard_size: int | str) -> bool:
        """Collective, where no rank holds the whole model (fsdp): write the final model into ``directory`` in
        ``save_pretrained``'s layout from every rank's shards, one tensor gathered at a time (engines/pretrained.py),
        and return True. False where rank 0 holds the model whole: the final output is then its ``save_pretrained``
        of ``full_model_state``."""
        return self.checkpointing.write_model_shards(model, directory, max_shard_size)

    def load_model_state(self, model: nn.Module, tensors: dict[str, torch.Tensor] | Path) -> None:
        """Load a checkpoint's tensors (every rank holds them, or reads them from the checkpoint directory a Path
        names: a sharded engine's resume) into the prepared model, on every rank."""
        self.checkpointing.load_model_state(model, tensors)

    def full_optimizer_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any] | None:
        """Collective: the optimizer's whole state on rank 0 (None on the others), in torch's format: the
        parameters numbered in the order of ``build_optimizer``'s groups, the same under every engine, so a
        checkpoint continues under another engine or world size."""
        return self.checkpointing.full_optimizer_state(model, optimizer)

    def load_optimizer_state(self, model: nn.Module, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """Load a checkpoint's whole optimizer state (every rank holds it), after ``prepare``."""
        self.checkpointing.load_optimizer_state(model, optimizer, state)

    def save_state_shards(
        self, model: nn.Module, optimizer: Optimizer, directory: Path, background: BackgroundWrite | None = None
    ) -> dict[str, str]:
        """Collective (``sharded_state``): write this rank's part of the model and optimizer state into a
        checkpoint's temporary ``directory``; {file inside it: SHA-256} of the files it wrote, for the manifest.
        The optimizer's go to state_io.OPTIMIZER_DIR; the model's to checkpoint.MODEL_FILE, or left for rank 0. A
        failure on any rank is raised on every rank (state_io.on_every_rank), not met in a later collective.
        ``background`` (--save_async): copy the state now, leave the writes to it and
        answer {} (state_io.written_digests)."""
        return self.checkpointing.save_state_shards(model, optimizer, directory, background)

    def background_write(self) -> BackgroundWrite:
        """Collective the first time: this rank's part of a save beside training (--save_async), for
        ``save_state_shards`` to stage into; its ``start`` writes, in a thread. Only an engine whose state is
        sharded saves beside training (the process-group engines': ProcessGroupEngine.background_write)."""
        raise NotImplementedError(f"{type(self).__name__} writes its state whole, not beside training")

    def on_every_rank(self, work: Callable[[], T]) -> T:
        """Collective: ``work`` on every rank, its failure on any rank raised on every rank (state_io.on_every_rank)."""
        return state_io.on_every_rank(self.gather_objects, work)

    def eval_module(self, model: nn.Module) -> nn.Module:
        """The module evaluation and prediction run (no gradient: no engine wrapper needed)."""
        return self.unwrap(model)

    # True where the model's forward is a collective (fsdp all-gathers each block's parameters): every rank must
    # then run as many forward passes as the others, in evaluation too.
    forward_is_collective: bool = False

    @property
    def replicate_degree(self) -> int:
        """The ranks that hold the same shard of the state (HSDP's replicas), for the memory model (its row's
        ``memory``, engines/memory.py); 1 elsewhere."""
        return 1

    def parameter_checksum(self, model: nn.Module) -> int:
        """Collective: the digest of the whole model's parameters (checksums.param_checksum), the same on every rank
        exactly when the ranks train the same model."""
        return self.checkpointing.parameter_checksum(model)

    def forward_loss(
        self, model: nn.Module, batch: dict[str, torch.Tensor], label_smoothing: float = 0.0
    ) -> torch.Tensor:
        """The forward pass and its loss, the task's (tasks.single_label.training_loss): imported here, as the loop's
        first step needs it, since the tasks import datasets and transformers, which a process that loads an engine
        without training (doctor, bench allreduce) does not pay for."""
        from horovod_train.tasks.single_label import training_loss

        return training_loss(model, batch, label_smoothing)

    def accumulation_context(self, model: nn.Module, is_last_micro_step: bool) -> contextlib.AbstractContextManager:
        """Context for a micro-step's forward and backward (DDP skips its all-reduce in it)."""
        return contextlib.nullcontext()

    def clip_and_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float, scaler: Any = None
    ) -> torch.Tensor | None:
        """Unscale (fp16's GradScaler), clip the norm of the whole (averaged) gradient, step. Without a scaler:
        clip and step. Returns the gradient's norm before clipping (``clip_gradient``), left on the device."""
        return clip_whole_and_step(model, optimizer, max_grad_norm, scaler)

    @abstractmethod
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks (float64 in, float64 out, so counts stay exact)."""

    def all_reduce_sum_async(self, tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        """Start ``all_reduce_sum``; the returned function waits for the result. Engines that can overlap
        it with the next step's compute do; the default completes at once."""
        result = self.all_reduce_sum(tensor)
        return lambda: result

    @abstractmethod
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate along dim 0 over ranks in rank order; the ranks' lengths may differ."""

    @abstractmethod
    def barrier(self) -> None: ...

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's JSON-serialisable ``obj``, in rank order, on every rank (built on all_gather)."""
        payload = torch.tensor(list(json.dumps(obj).encode()), dtype=torch.uint8, device=self.device)
        lengths = self.all_gather(torch.tensor([payload.numel()], dtype=torch.int64, device=self.device))
        chunks = self.all_gather(payload).cpu().split(lengths.cpu().tolist())
        return [json.loads(bytes(chunk.tolist()).decode()) for chunk in chunks]

    @abstractmethod
    def broadcast_(self, tensor: torch.Tensor) -> None:
        """Overwrite ``tensor`` (contiguous, on the CPU, the same shape and dtype on every rank) with rank 0's."""

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank, of any size: one copy of its tensors per rank (see payload).
        Pickled in memory between our own ranks: never from a file."""
        if self.world_size == 1:
            return obj
        return broadcast_from_root(obj, self.broadcast_, self.is_main)

    def local_main_first(self, work: Callable[[], T]) -> T:
        """Run ``work`` on each node's local rank 0 first (it fills caches), then on the others."""
        result = work() if self.is_local_main else None
        self.barrier()
        if not self.is_local_main:
            result = work()
        return result  # type: ignore[return-value]

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "world_size": self.world_size, "device": str(self.device)}

    @contextlib.contextmanager
    def running(self) -> Iterator[Engine]:
        self.setup()
        try:
            yield self
        finally:
            self.shutdown()

    def shutdown(self) -> None:  # noqa: B027 (an optional hook: most engines have nothing to tear down)
        pass


def clip_whole_and_step(
    model: nn.Module, optimizer: Optimizer, max_grad_norm: float, scaler: Any = None
) -> torch.Tensor:
    """Where every rank holds the whole averaged gradient: unscale (fp16's GradScaler), clip its norm, step. Returns
    the norm before clipping, left on the device (``clip_gradient``)."""
    amp.unscale(optimizer, scaler)
    norm = clip_gradient(model.parameters(), max_grad_norm)
    amp.optimizer_step(optimizer, scaler)
    return norm
