"""The engines, one row each (torchtitan's model specs): an ``EngineSpec`` says everything the rest of the project asks
of an engine without running it: its ``--engine`` name, its class (imported when a run asks for it), the launcher that
starts its ranks on one machine, its options (a section of train's arguments, each field's domain in its metadata),
the runs compare and bench make of it, and the module it needs beyond torch. ``ENGINES`` is the registry: `train`'s
arguments and checks, ``create_engine``, compare, bench, doctor, the launchers' implied engines, the Kubernetes
renderer and the SLURM script read it; nothing else names an engine.

Adding an engine is one module (an ``Engine`` subclass, engines/base.py) and one row here. Reading the rows imports
no engine, torch nor transformers (a batch script, the argument checks and launch/k8s/render.py read them before a
job starts): each class is imported by a function of its own, and the option modules import no engine.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from horovod_train.common.errors import UsageError
from horovod_train.engines.communication import Buckets, Communication, FusionCycle, PerBlock
from horovod_train.engines.ddp_options import DDPArguments
from horovod_train.engines.fsdp_options import FSDPArguments
from horovod_train.engines.horovod.options import HorovodArguments
from horovod_train.engines.memory import FullySharded, FusionBuffered, GatheredOnOne, OptimizerSharded, Replicated

if TYPE_CHECKING:
    from horovod_train.engines.base import Engine


def process_group_backend() -> str:
    """torch.distributed's backend for this machine's runs (DDPArguments' auto): NCCL with GPUs, else Gloo."""
    import torch

    return DDPArguments().backend_on(torch.cuda.device_count() > 0)


def process_group_ready() -> bool:
    """torch.distributed and this machine's backend are built into this torch."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    return dist.is_nccl_available() if process_group_backend() == "nccl" else dist.is_gloo_available()


def horovod_built(controller: Literal["gloo", "mpi"]) -> Callable[[], bool]:
    """Horovod is importable here and built with ``controller`` (horovodrun's Gloo, or MPI)."""

    def built() -> bool:
        try:
            import horovod.torch as hvd
        except (ImportError, OSError):  # OSError: a Horovod built against another torch fails to load its library
            return False
        return bool(hvd.gloo_built() if controller == "gloo" else hvd.mpi_built())

    return built


def always() -> bool:
    return True


@dataclass(frozen=True)
class Variant:
    """A run compare and bench make of an engine. ``name``: the run's name ("{backend}": this machine's
    process_group_backend); ``launcher``: the launcher row that starts it on one machine; ``args``: the train
    arguments that make it differ from the engine's default (a run with some is made only when --engines names it);
    ``ready``: what this machine needs beyond the launcher's tool."""

    name: str
    launcher: str
    args: tuple[str, ...] = ()
    ready: Callable[[], bool] = always

    def run_name(self, backend: str) -> str:
        return self.name.format(backend=backend)


def on_torchrun(name: str, **variants: tuple[str, ...]) -> tuple[Variant, ...]:
    """A torchrun engine's runs, named by the process group's backend: its default, then one per named variant."""
    return (Variant(f"{name}-{{backend}}", "torchrun", ready=process_group_ready),
            *(Variant(f"{name}-{variant}-{{backend}}", "torchrun", args, process_group_ready)
              for variant, args in variants.items()))  # fmt: skip


def plain(name: str) -> tuple[Variant, ...]:
    return (Variant(name, "plain"),)


@dataclass(frozen=True)
class GpuDemo:
    """The GPU check's demo of an engine (gpucheck/steps.py): the demo job for one epoch, one process on one GPU
    started by the engine's launcher; its loss must fall (over NCCL under torchrun). ``checks``: what it runs on the
    GPU, the plan's line after "demo job, 1 epoch, "; ``order``: its place among the check's later steps, which run
    as far as the time budget goes (lower first; the check's own: steps.LATER_STEPS)."""

    checks: str
    order: int


@dataclass(frozen=True)
class EngineSpec:
    """One engine. ``launcher``: the launcher row (horovod_train/launching) that starts its ranks on one machine;
    its ranks meet through that launcher's rendezvous, so they run under every launcher that offers it (launching's
    check_joins), and a launcher whose own rendezvous it is implies the first such row (doctor). ``options``: its
    section of train's arguments (rows may share one: zero1 reads ddp's). ``needs``: the module it needs beyond
    torch, which may be missing (Horovod is no pip dependency: horovod-train build-horovod). ``memory``: its part of
    the memory model (engines/memory.py: how it spreads the training state; the memory check before start and
    bench's fit and memory ask it). ``communication``: how its gradient reduction is scheduled
    (engines/communication.py; `bench project` models it), None where its ranks share no collective.
    ``reference``: the engine every other one is checked against (one process, no collective: docs/equivalence.md,
    the GPU check, bench gpu). ``process_per_rank``: False for an engine whose one process drives every visible
    device (doctor joins a job of ranks). ``gpu_demo``: its step in the GPU check. ``foreign_flags``: other tools'
    flags that mean this engine (transformers' Trainer's, DeepSpeed's) -> the hint train gives for one
    (config/arguments.py's FOREIGN_NAMES)."""

    name: str
    engine: Callable[[], type[Engine]]
    launcher: str
    variants: tuple[Variant, ...]
    options: type | None = None
    needs: str | None = None
    memory: type[Replicated] = Replicated
    communication: Communication | None = None
    reference: bool = False
    process_per_rank: bool = True
    gpu_demo: GpuDemo | None = None
    foreign_flags: Mapping[str, str] = field(default_factory=dict, hash=False)

    def installed(self) -> bool:
        """What it needs beyond torch is installed (found, not imported)."""
        return self.needs is None or importlib.util.find_spec(self.needs.partition(".")[0]) is not None

    def can_run(self) -> bool:
        """What it needs beyond torch can be imported here (imports it)."""
        try:
            return self.needs is None or importlib.import_module(self.needs) is not None
        except (ImportError, OSError):  # OSError: a Horovod built against another torch fails to load its library
            return False


def _horovod() -> type[Engine]:
    from horovod_train.engines.horovod.engine import HorovodEngine

    return HorovodEngine


def _ddp() -> type[Engine]:
    from horovod_train.engines.ddp import DDPEngine

    return DDPEngine


def _fsdp() -> type[Engine]:
    from horovod_train.engines.fsdp import FSDPEngine

    return FSDPEngine


def _zero1() -> type[Engine]:
    from horovod_train.engines.zero1 import Zero1Engine

    return Zero1Engine


def _single() -> type[Engine]:
    from horovod_train.engines.single import SingleEngine

    return SingleEngine


def _dp() -> type[Engine]:
    from horovod_train.engines.dp import DataParallelEngine

    return DataParallelEngine


# In the order of preference: a launcher implies the first row whose ranks meet through its rendezvous, compare runs
# them in this order, and the option sections are train's --help sections in this order. `--engine` lists the names
# in alphabetical order (names()).
ENGINES: dict[str, EngineSpec] = {spec.name: spec for spec in (
    EngineSpec("horovod", _horovod, "horovodrun", options=HorovodArguments, needs="horovod.torch",
               variants=(Variant("horovod-gloo", "horovodrun", ready=horovod_built("gloo")),
                         Variant("horovod-mpi", "mpirun", ready=horovod_built("mpi"))),
               memory=FusionBuffered, communication=FusionCycle(),
               gpu_demo=GpuDemo("Horovod np=1 (NCCL)", 50),
               ),
    EngineSpec("ddp", _ddp, "torchrun", on_torchrun("ddp"),
               memory=Replicated, communication=Buckets(),
               options=DDPArguments,
               gpu_demo=GpuDemo("DDP np=1 (NCCL: DDP's reducer at size 1)", 10),
               ),
    EngineSpec("fsdp", _fsdp, "torchrun", on_torchrun("fsdp", zero2=("--fsdp_reshard_after_forward", "false")),
               memory=FullySharded, communication=PerBlock(),
               options=FSDPArguments,
               gpu_demo=GpuDemo("FSDP2 np=1 (NCCL: all-gather and reduce-scatter at size 1)", 30),
               foreign_flags={
                   "fsdp": "did you mean --engine fsdp (launched by torchrun)? It shards as full_shard; "
                   "--fsdp_reshard_after_forward false is shard_grad_op.",
                   "fsdp_config": "drop it: --engine fsdp takes its options as flags (--fsdp_reshard_after_forward).",
               },
               ),
    EngineSpec("zero1", _zero1, "torchrun", on_torchrun("zero1"),
               memory=OptimizerSharded, communication=Buckets(gather_after_step=True),
               options=DDPArguments,
               gpu_demo=GpuDemo("ZeRO-1 np=1 (NCCL: DDP plus the optimizer state's shard)", 20),
               foreign_flags={"deepspeed": "DeepSpeed is not supported; for its ZeRO sharding use --engine zero1 "
                              "(optimizer state, ZeRO-1) or --engine fsdp (everything, ZeRO-3), launched by torchrun."},
               ),
    EngineSpec("single", _single, "plain", plain("single"),
               memory=Replicated,
               reference=True,
               ),
    EngineSpec("dp", _dp, "plain", plain("dp"),
               memory=GatheredOnOne,
               process_per_rank=False,
               gpu_demo=GpuDemo("DataParallel on the visible GPUs", 80),
               ),
)}  # fmt: skip


def names() -> list[str]:
    """The engines' names as --engine lists them (the registry as it is now: a test's row too)."""
    return sorted(ENGINES)


def spec_of(name: str) -> EngineSpec:
    """The row of ``--engine name``: the one check of an engine's name."""
    if name not in ENGINES:
        raise UsageError(f"unknown engine {name!r}", f"use --engine {' or '.join(names())}")
    return ENGINES[name]


def reference_engine() -> str:
    """The engine every other one is checked against: the row that says it is the reference."""
    for spec in ENGINES.values():
        if spec.reference:
            return spec.name
    raise LookupError(f"no row of {tuple(ENGINES)} says it is the reference (EngineSpec.reference)")


def started_by(launcher: str) -> list[str]:
    """The engines whose ranks ``launcher`` starts on one machine, in the registry's order."""
    return [spec.name for spec in ENGINES.values() if spec.launcher == launcher]


def option_sections() -> dict[str, type]:
    """Each engine's options by the name of the first row that has them (train's --help sections, in order)."""
    sections: dict[str, type] = {}
    for spec in ENGINES.values():
        if spec.options is not None and spec.options not in sections.values():
            sections[spec.name] = spec.options
    return sections
