"""`horovod-train doctor`: under any launcher, rank 0 prints who runs where and what Horovod supports."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from horovod_train import __version__
from horovod_train.common.errors import UsageError
from horovod_train.common.tables import format_table
from horovod_train.config.run_config import RunConfig, TrainingArguments
from horovod_train.engines.joining import check_launch, implied_engine
from horovod_train.engines.specs import ENGINES, names, spec_of
from horovod_train.launching import LAUNCHERS, environment
from horovod_train.launching.base import hostname
from horovod_train.launching.horovodrun import ran_mpirun

FRAMEWORKS = {"torch": "PyTorch", "tensorflow": "TensorFlow", "mxnet": "MXNet"}
# Horovod is no pip dependency of horovod-train: it is compiled against the torch of the environment it goes into.
HOROVOD_BUILD_HINT = [
    "  build it against this environment's torch: horovod-train build-horovod",
    f"  (from a checkout: PYTHON={sys.executable} bash scripts/build_horovod.sh);",
    "  --engine ddp, dp and single work without it",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", default="auto", help=f"engine used to join the job (auto: {implied_engines()})")


def implied_engines() -> str:
    """``horovod under horovodrun and mpirun, ...``: the engine each launcher of the table implies."""
    under: dict[str, list[str]] = {}
    for row in LAUNCHERS.values():
        under.setdefault(implied_engine(row), []).append(f"plain {row.tool}" if row.fallback else row.name)
    return ", ".join(f"{engine} under {' and '.join(names)}" for engine, names in under.items())


def checkbox(flag: bool) -> str:
    return "[X]" if flag else "[ ]"


def horovod_support() -> list[str]:
    """The `horovodrun --check-build` facts, read in this process (no subprocess after MPI_Init)."""
    try:
        import horovod
        import horovod.torch as hvd
    except (ImportError, OSError) as exc:
        return [f"horovod: not importable ({str(exc).splitlines()[0][:120]})", *HOROVOD_BUILD_HINT]
    root = Path(horovod.__file__).parent
    built = {label: any((root / name).glob("mpi_lib*")) for name, label in FRAMEWORKS.items()}

    def boxes(flags: dict[str, bool]) -> str:
        return "  ".join(f"{checkbox(v)} {k}" for k, v in flags.items())

    return [
        f"horovod {horovod.__version__}",
        f"  frameworks:        {boxes(built)}",
        f"  controllers:       {boxes({'MPI': hvd.mpi_built(), 'Gloo': hvd.gloo_built()})}",
        "  tensor operations: "
        + boxes(
            {
                "NCCL": hvd.nccl_built(),
                "DDL": hvd.ddl_built(),
                "CCL": hvd.ccl_built(),
                "MPI": hvd.mpi_built(),
                "Gloo": hvd.gloo_built(),
            }
        ),
        f"  GPU builds:        {boxes({'CUDA': hvd.cuda_built(), 'ROCm': hvd.rocm_built()})}",
    ]


def torch_support() -> list[str]:
    import torch
    import torch.distributed as dist

    backends = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()}
    return [
        f"torch {torch.__version__}: {torch.cuda.device_count()} GPU(s) visible, mpi4py "
        f"{'yes' if importlib.util.find_spec('mpi4py') else 'no'}",
        "  torch.distributed backends: " + "  ".join(f"{checkbox(v)} {k}" for k, v in backends.items()),
    ]


def launcher_named(env: environment.DistEnv, variables: Mapping[str, str]) -> str:
    """The launcher the user ran: ``horovodrun --mpi`` where the table reads mpirun's ranks that horovodrun started."""
    if env.launcher == "mpirun" and ran_mpirun(variables):
        return "horovodrun --mpi"
    return env.launcher


def engines_line() -> str:
    """The engines that can run here (those whose module is missing named apart, with what they need)."""
    missing = [ENGINES[name] for name in names() if not ENGINES[name].can_run()]
    line = f"engines: {', '.join(name for name in names() if ENGINES[name] not in missing)}"
    return line + "".join(f" (not {spec.name}: {spec.needs} is not importable)" for spec in missing)


def device_rules(used: set[str]) -> list[str]:
    """What each device rule in the table means."""
    return [f"device_rule {rule}: {environment.DEVICE_RULES[rule]}" for rule in sorted(used)]


def main(args: argparse.Namespace) -> int:
    from horovod_train.engines import create_engine

    env = environment.detect(resolve_master=False)
    name = implied_engine(LAUNCHERS[env.launcher]) if args.engine == "auto" else args.engine
    if not spec_of(name).process_per_rank:  # one process for every device: no ranks to join
        joining = [engine for engine in names() if ENGINES[engine].process_per_rank]
        raise UsageError("doctor joins a job with one process per rank", f"use --engine {' or '.join(joining)}")
    check_launch(name)
    engine = create_engine(RunConfig(training=TrainingArguments(engine=name)))
    with engine.running():
        row = {
            "rank": engine.rank,
            "local_rank": engine.local_rank,
            "host": hostname(),
            "device": str(engine.device),
            "device_rule": engine.device_rule,
        }
        rows = engine.gather_objects(row)
        if engine.is_main:
            described = engine.describe()
            detail = ", ".join(f"{k} {described[k]}" for k in ("controller", "backend") if k in described)
            launcher = launcher_named(env, os.environ)
            lines = [
                f"launcher: {launcher}, world size {engine.world_size}, joined with engine {name}"
                + (f" ({detail})" if detail else ""),
                *format_table(list(row), [list(r.values()) for r in rows]),
                *device_rules({r["device_rule"] for r in rows}),
                *horovod_support(),
                *torch_support(),
                engines_line(),
                f"horovod-train {__version__} ({Path(__file__).parents[1]})",
            ]
            print("\n".join(lines), flush=True)
    return 0
