"""What a build would do for this environment: its tools, its options for Horovod's setup.py, its cache key."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from horovod_train.build_horovod import gpu, toolchain
from horovod_train.build_horovod.target import Target
from horovod_train.common.errors import UsageError

T = TypeVar("T")
HOROVOD_VERSION = "0.28.1"  # the last release; it needs the C++17 patch for torch >= 2.1 (build.py)


@dataclass(frozen=True)
class Options:
    force: bool = False
    dry_run: bool = False
    nccl: bool | None = None  # None: when torch is a CUDA build and NCCL is found
    mpi: bool | None = None  # None: when mpicxx is found
    cuda_archs: str | None = None
    jobs: int | None = None
    debug_info: bool = False  # Horovod's own RelWithDebInfo build (build.BUILD_TYPE_PATCH), its own cache key


@dataclass
class Plan:
    target: Target
    version: str
    mpi: bool
    compiler: str | None = None  # with_build_tools finds them, for a build only: a cached wheel needs neither
    cmake: str | None = None
    build_modules: str | None = None  # setuptools and wheel, which Horovod's setup.py builds with
    cuda_home: Path | None = None
    nvcc: str | None = None
    cuda_archs: str | None = None
    nccl_env: dict[str, str] = field(default_factory=dict)
    nccl_source: str = "not used (CPU torch)"
    debug_info: bool = False
    missing: dict[str, UsageError] = field(default_factory=dict)  # what is missing (mpi, cuda, a build tool) -> why

    @property
    def nccl(self) -> bool:
        return bool(self.nccl_env)

    @property
    def key(self) -> str:
        """One wheel per (horovod, torch, CUDA, python, architectures, NCCL, MPI); the default builds keep the key
        scripts/podman_build.sh computes (horovod-VERSION-torchVERSION-cudaCUDA-cpXY[-smA_B])."""
        target = self.target
        key = f"horovod-{self.version}-torch{target.torch_version.replace('+', '_')}-cuda{target.torch_cuda or 'cpu'}"
        key += f"-{target.pytag}"
        if target.torch_cuda and self.cuda_archs:
            key += "-sm" + self.cuda_archs.replace(",", "_")
        if target.torch_cuda and not self.nccl:
            key += "-nonccl"
        if self.debug_info:
            key += "-debuginfo"
        return key if self.mpi else key + "-nompi"

    @property
    def wheel_dir(self) -> Path:
        return cache_root() / self.key

    def describe(self) -> list[str]:
        target = self.target
        lines = [
            f"python:     {target.python}",
            f"torch:      {target.torch_version} ({f'CUDA {target.torch_cuda}' if target.torch_cuda else 'CPU build'})",
            f"horovod:    {self.version} (PyTorch, Gloo{', MPI' if self.mpi else ''}{', NCCL' if self.nccl else ''})",
            f"compiler:   {self.tool_line('compiler', self.compiler)}",
            f"cmake:      {self.tool_line('cmake', self.cmake)}",
            f"mpi:        {self.tool_line('mpi', 'yes (mpicxx found)' if self.mpi else 'no (Gloo controller only)')}",
            f"modules:    {self.tool_line('modules', self.build_modules)}",
            f"build type: {'RelWithDebInfo (--debug-info)' if self.debug_info else 'Release (-O3, no debug info)'}",
        ]
        if target.torch_cuda:
            lines += [
                f"cuda:       {self.tool_line('cuda', f'{self.cuda_home} (nvcc {self.nvcc})')}",
                f"archs:      {self.cuda_archs or 'Horovod default'}",
            ]
        lines.append(f"nccl:       {self.nccl_source}")
        lines += [f"            {k}={v}" for k, v in sorted(self.nccl_env.items())]
        return [*lines, f"cache key:  {self.key}", f"wheel dir:  {self.wheel_dir}"]

    def tool_line(self, tool: str, found: str | None) -> str:
        if tool in self.missing:
            return f"MISSING: {self.missing[tool].problem} (fix: {self.missing[tool].fix})"
        return found or "not needed (no build)"


def cache_root() -> Path:
    """HOROVOD_WHEEL_CACHE, else the project's cache (HOROVOD_TRAIN_CACHE, else ~/.cache/horovod-train)/wheels."""
    if os.environ.get("HOROVOD_WHEEL_CACHE"):
        return Path(os.environ["HOROVOD_WHEEL_CACHE"])
    if os.environ.get("HOROVOD_TRAIN_CACHE"):
        return Path(os.environ["HOROVOD_TRAIN_CACHE"]) / "wheels"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "horovod-train" / "wheels"


def make_plan(target: Target, options: Options, collect: bool = False) -> Plan:
    """What to build and its cache key. What is missing is found before anything is downloaded or built: here what
    the key depends on (MPI headers, the CUDA toolkit, NCCL), in with_build_tools what only a build needs; all of
    it is named in one UsageError (``missing_error``), here unless ``collect`` (then in ``plan.missing``)."""
    path = toolchain.search_path(target.bin_dir)
    plan = Plan(target=target, version=os.environ.get("HOROVOD_VERSION") or HOROVOD_VERSION, mpi=True,
                debug_info=options.debug_info)  # fmt: skip
    # MPI wanted (mpirun, or --with-mpi) but its headers missing: planned as the build with MPI that it would be
    plan.mpi = _found(plan, "mpi", lambda: toolchain.find_mpi(path, options.mpi)) is not False
    if options.nccl and not target.torch_cuda:
        raise UsageError(
            f"--with-nccl, but torch {target.torch_version} is a CPU build", "install a CUDA torch, or drop --with-nccl"
        )
    cuda = _found(plan, "cuda", lambda: toolchain.find_cuda(target.torch_cuda, path)) if target.torch_cuda else None
    if cuda:
        plan.cuda_home, plan.nvcc = cuda
        release = toolchain.nvcc_release(plan.nvcc) or target.torch_cuda
        plan.cuda_archs = gpu.cuda_archs(plan.nvcc, release, options.cuda_archs)
        found = _found(plan, "nccl", lambda: gpu.find_nccl(target.prefix, cuda[0], options.nccl,
                                                           link=not options.dry_run))  # fmt: skip
        if found:
            plan.nccl_env, plan.nccl_source = found
    if plan.missing and not collect:
        raise missing_error(plan)
    return plan


def with_build_tools(plan: Plan, collect: bool = False) -> Plan:
    """The compiler, cmake, setuptools and wheel a build needs, found: an environment installing a cached wheel
    (another venv with the same torch) needs none of them. Every missing one is recorded in ``plan.missing``, so
    that the plan printed before the error marks them, and named in one UsageError with the rest (unless
    ``collect``)."""
    path = toolchain.search_path(plan.target.bin_dir)
    plan.compiler = _found(plan, "compiler", lambda: toolchain.find_compiler(path))
    plan.cmake = _found(plan, "cmake", lambda: toolchain.find_cmake(path))
    _found(plan, "modules", toolchain.check_build_modules)
    plan.build_modules = "setuptools and wheel"  # shown where not missing
    if plan.missing and not collect:
        raise missing_error(plan)
    return plan


def missing_error(plan: Plan) -> UsageError:
    """Everything the plan misses in one line (a dry run names them all at once, not one per attempt)."""
    errors = list(plan.missing.values())
    if len(errors) == 1:
        return errors[0]
    problems = ", ".join(f"({i}) {error.problem}" for i, error in enumerate(errors, 1))
    fixes = ", ".join(f"({i}) {error.fix}" for i, error in enumerate(errors, 1))
    return UsageError(f"{len(errors)} things missing for the Horovod build: {problems}", fixes)


def _found(plan: Plan, tool: str, find: Callable[[], T]) -> T | None:
    try:
        return find()
    except UsageError as error:
        plan.missing[tool] = error
        return None
