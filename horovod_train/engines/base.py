"""The engine interface: everything the trainer needs from a data-parallel backend, and nothing more.

An engine owns process setup, device placement, model/optimizer wrapping, the gradient step and the
collectives used for metrics. The trainer calls only these methods, so it knows nothing of Horovod,
torch.distributed or DataParallel.
"""

from __future__ import annotations

import contextlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from torch import nn
from torch.optim import Optimizer

from horovod_train import amp, peak_memory
from horovod_train import checkpoint as ckpt
from horovod_train.checksums import param_checksum
from horovod_train.engines import state_io
from horovod_train.engines.payload import broadcast_from_root
from horovod_train.engines.policy import RunPolicy
from horovod_train.engines.state_io import BackgroundWrite

if TYPE_CHECKING:
    from horovod_train.config import RunConfig

T = TypeVar("T")


def classification_loss(model: nn.Module, batch: dict[str, torch.Tensor], label_smoothing: float) -> torch.Tensor:
    """The model's own loss, or with label smoothing the cross-entropy transformers' LabelSmoother computes
    ((1 - eps) * NLL + eps * the mean over classes of -log p: torch's ``label_smoothing``)."""
    if not label_smoothing:
        return model(**batch).loss
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    logits, labels = logits.float().view(-1, logits.size(-1)), batch["labels"].view(-1)
    return nn.functional.cross_entropy(logits, labels, label_smoothing=label_smoothing)


class Engine(ABC):
    """Replicated engines (single, dp, horovod, ddp) hold the whole model, its gradients and the optimizer's state
    on every rank; a sharded engine (zero1: the optimizer's state; fsdp: all three) overrides the methods of the
    model's state below, which the trainer, its checkpoints, evaluation and results call instead of reading the
    model or the optimizer themselves."""

    name: str = ""
    # Named variants that compare and bench run beside the engine's default when asked for by name (or by the
    # engine's name): variant -> its train arguments. fsdp's "zero2" keeps gathered blocks until backward.
    run_variants: ClassVar[dict[str, tuple[str, ...]]] = {}
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

    def joins_running_job(self, output_dir: str) -> bool:
        """True for a worker added to a running job (elastic), which must leave ``output_dir`` as it is."""
        return False

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    # ---- the model's state, however it is spread over the ranks ----------------------------------------------
    def full_model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Collective: the whole model's state dict on rank 0 (for ``save_pretrained`` and checkpoints), {} on the
        others. A replicated engine's are the model's own tensors, not copies."""
        return self.unwrap(model).state_dict() if self.is_main else {}

    def load_model_state(self, model: nn.Module, tensors: dict[str, torch.Tensor] | Path) -> None:
        """Load a checkpoint's tensors (every rank holds them, or reads them from the checkpoint directory a Path
        names: a sharded engine's resume) into the prepared model, on every rank."""
        if isinstance(tensors, Path):
            tensors = ckpt.read_model_tensors(tensors)
        module = self.unwrap(model)
        module.load_state_dict(ckpt.model_state(tensors, module))

    def full_optimizer_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any] | None:
        """Collective: the optimizer's whole state on rank 0 (None on the others), in torch's format: the
        parameters numbered in the order of ``build_optimizer``'s groups, the same under every engine, so a
        checkpoint continues under another engine or world size."""
        return optimizer.state_dict() if self.is_main else None

    def load_optimizer_state(self, model: nn.Module, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """Load a checkpoint's whole optimizer state (every rank holds it), after ``prepare``."""
        load_keeping_implementation(optimizer, state)

    # True where every rank writes and reads its own part of a checkpoint's model and optimizer state (state_io);
    # False: rank 0 writes the state gathered by the methods above, and reads it for every rank.
    sharded_state: bool = False

    def save_state_shards(
        self, model: nn.Module, optimizer: Optimizer, directory: Path, background: BackgroundWrite | None = None
    ) -> dict[str, str]:
        """Collective (``sharded_state``): write this rank's part of the model and optimizer state into a
        checkpoint's temporary ``directory``; {file inside it: SHA-256} of the files it wrote, for the manifest.
        The optimizer's go to state_io.OPTIMIZER_DIR; the model's to checkpoint.MODEL_FILE, or left for rank 0. A
        failure on any rank is raised on every rank (state_io.on_every_rank), not met in a later collective.
        ``background`` (--save_async): copy the state now, leave the writes to it and
        answer {} (state_io.written_digests)."""
        raise NotImplementedError(f"{self.name} writes its checkpoint's state whole, from rank 0")

    def background_write(self) -> BackgroundWrite:
        """Collective the first time: this rank's part of a save beside training (--save_async), for
        ``save_state_shards`` to stage into; its ``start`` writes, in a thread."""
        return BackgroundWrite()

    def on_every_rank(self, work: Callable[[], T]) -> T:
        """Collective: ``work`` on every rank, its failure on any rank raised on every rank (state_io.on_every_rank)."""
        return state_io.on_every_rank(self.gather_objects, work)

    def eval_module(self, model: nn.Module) -> nn.Module:
        """The module evaluation and prediction run (no gradient: no engine wrapper needed)."""
        return self.unwrap(model)

    # True where the model's forward is a collective (fsdp all-gathers each block's parameters): every rank must
    # then run as many forward passes as the others, in evaluation too.
    forward_is_collective: bool = False

    @classmethod
    def state_bytes_per_rank(cls, params: int, trainable: int, world_size: int) -> float:
        """Bytes of training state a rank holds for a model of ``params`` parameters, ``trainable`` of them trained,
        at ``world_size`` ranks: fp32 weights (4), and for each trained one its gradient (4) and AdamW's two moments
        (8). A class method: the memory check before start and `bench memory` ask it before any engine exists."""
        return 4 * params + 12 * trainable

    @classmethod
    def save_gather_bytes(cls, params: int, trainable: int, world_size: int) -> float:
        """Bytes rank 0 holds on top of its state while a save gathers the whole model and optimizer there: none
        where every rank holds them whole already."""
        return 0.0

    @classmethod
    def peak_bytes_per_rank(cls, params: int, trainable: int, world_size: int, activations: float) -> dict[str, float]:
        """The engines' memory model: rank 0's peak, by part (the process's base, the training state as this engine
        spreads it, ``activations``, what a save gathers on rank 0). The memory check before start and `bench fit`
        ask it."""
        return {
            "base": peak_memory.BASE_BYTES,
            "state": cls.state_bytes_per_rank(params, trainable, world_size),
            "activations": activations,
            "save gather": cls.save_gather_bytes(params, trainable, world_size),
        }

    def parameter_checksum(self, model: nn.Module) -> int:
        """Collective: the digest of the whole model's parameters (checksums.param_checksum), the same on every rank
        exactly when the ranks train the same model."""
        return param_checksum(self.unwrap(model))

    def forward_loss(
        self, model: nn.Module, batch: dict[str, torch.Tensor], label_smoothing: float = 0.0
    ) -> torch.Tensor:
        return classification_loss(model, batch, label_smoothing)

    def accumulation_context(self, model: nn.Module, is_last_micro_step: bool) -> contextlib.AbstractContextManager:
        """Context for a micro-step's forward and backward (DDP skips its all-reduce in it)."""
        return contextlib.nullcontext()

    def clip_and_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float, scaler: Any = None
    ) -> None:
        """Unscale (fp16's GradScaler), clip the norm of the whole (averaged) gradient, step. Without a scaler:
        clip and step."""
        amp.unscale(optimizer, scaler)
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        amp.optimizer_step(optimizer, scaler)

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


def load_keeping_implementation(optimizer: Optimizer, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(state)``: the groups' settings come back from the checkpoint, the implementation
    (fused or not) stays the one this run asked for."""
    implementation = [group.get("fused") for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, fused in zip(optimizer.param_groups, implementation, strict=True):
        group["fused"] = fused
