"""`build-horovod --dry-run` as a program: in .venv (CPU torch) and in the NCCL build's environment (CUDA torch,
nvidia-nccl-cu13; scripts/build_horovod_nccl.sh makes it), where it must find the toolkit, the NCCL wheel and
the key of the wheel that script built; and a missing tool is one line, exit 2, from the console script too."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import builds
from support.jobs import REPO, assert_ok
from support.launch import assert_usage_error
from support.nccl import have_nvcc

# The running interpreter's tag: the NCCL environment is made from the same python3 (scripts/build_horovod_nccl.sh).
PY_TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"
NCCL_VENV = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "horovod-train"
NCCL_PYTHON = NCCL_VENV / f"venv-nccl-2.13.0-{PY_TAG}" / "bin" / "python"


def dry_run(python: Path | str, env: dict[str, str] | None = None, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    cmd = [str(python), "-m", "horovod_train.build_horovod", "--dry-run", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def nccl_python() -> Path:
    """The NCCL build's environment, made here if no test made it yet (tests run in any order; a cache hit after
    tests/system/test_nccl_build.py or test_gpu_image.py, which build the same)."""
    if not have_nvcc():
        pytest.skip("needs nvcc (the CUDA 13 toolkit) for the NCCL build's environment; there is none")
    proc = builds.result("nccl")  # begun when the session started
    assert proc is not None
    assert_ok(proc)
    assert NCCL_PYTHON.is_file(), proc.stdout[-3000:]
    return NCCL_PYTHON


def test_dry_run_with_the_cpu_torch_writes_nothing(tmp_path) -> None:
    proc = dry_run(sys.executable, {"HOROVOD_WHEEL_CACHE": str(tmp_path / "wheels")})
    assert proc.returncode == 0, proc.stderr
    assert "(CPU build)" in proc.stdout and "nccl:       not used (CPU torch)" in proc.stdout, proc.stdout
    key = f"horovod-0.28.1-torch{torch.__version__.replace('+', '_')}-cudacpu-{PY_TAG}"
    assert f"cache key:  {key}" in proc.stdout, proc.stdout
    assert not (tmp_path / "wheels").exists()


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.builds("nccl")
def test_dry_run_in_the_nccl_environment_finds_cuda_torch_and_nccl(nccl_python: Path) -> None:
    proc = dry_run(nccl_python, {"HOROVOD_NCCL_HOME": "", "HOROVOD_NCCL_LIB": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "torch:      2.13.0+cu130 (CUDA 13.0)" in out and "PyTorch, Gloo, MPI, NCCL" in out, out
    assert "nccl:       pip wheel (headers " in out and "HOROVOD_NCCL_LINK=SHARED" in out, out
    assert f"HOROVOD_NCCL_LIB={nccl_python.parent.parent / 'nccl-link'}" in out, out
    # the key scripts/podman_build.sh and earlier builds used: the wheel built before stays a cache hit
    assert f"cache key:  horovod-0.28.1-torch2.13.0_cu130-cuda13.0-{PY_TAG}-sm75_80_86_89_90_100_120" in out, out


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.builds("nccl")
def test_an_architecture_nvcc_lacks_is_one_line(nccl_python: Path) -> None:
    proc = dry_run(nccl_python, {}, "--cuda-archs", "90,52")
    assert_usage_error(proc, "CUDA architecture 52", "use some of:")


def test_console_script_names_the_missing_compiler(tmp_path) -> None:
    """A PATH with no compiler: the installed console script says so before anything else."""
    env = {**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(REPO), "HOROVOD_WHEEL_CACHE": str(tmp_path)}
    env.pop("CXX", None)
    cmd = [str(Path(sys.executable).parent / "horovod-train"), "build-horovod"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert_usage_error(proc, "no C++ compiler", "apt-get install g++")


def test_an_installed_horovod_is_one_line_not_the_check_build_banner() -> None:
    """What every `make setup` (so every `make demo`, `make test-fast`) prints for this environment's Horovod."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "horovod_train.build_horovod"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        f"[horovod] 0.28.1 (PyTorch, Gloo, MPI) already installed for {sys.executable}: nothing to build "
        "(`horovod-train build-horovod --dry-run` shows the plan)"
    ], proc.stdout


def requirements_installed(venv: Path) -> bool:
    """setup.sh's stamp: the environment holds what the requirements say (its pip stages would be skipped)."""
    files = [REPO / name for name in ("requirements.txt", "requirements-dev.txt", "pyproject.toml")]
    want = hashlib.sha256(b"".join(path.read_bytes() for path in files)).hexdigest()
    stamp = venv / ".requirements.sha256"
    return stamp.is_file() and stamp.read_text().strip() == want


def test_setup_says_each_stage_with_its_time() -> None:
    """scripts/setup.sh where everything is installed (its fast path, a no-op): a line per stage with its time."""
    venv = Path(sys.prefix)
    if not requirements_installed(venv):
        pytest.skip(f"{venv} is not the environment `make setup` made for this checkout: the test would reinstall it")
    env = {**os.environ, "VENV": str(venv)}
    proc = subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[setup]")]
    time = r"(\d+\.\d s|\d+ min \d\d s)"
    assert [re.sub(time, "T", line) for line in lines] == [
        "[setup] MPI ...",
        "[setup] MPI: done in T",
        "[setup] Python dependencies up to date",
        "[setup] bytecode of horovod_train ...",
        "[setup] bytecode of horovod_train: done in T",
        "[setup] Horovod ...",
        "[setup] Horovod: done in T",
        f"[setup] ready: {venv} (setup took T)",
    ], proc.stdout
    assert "Available Frameworks" not in proc.stdout, proc.stdout  # no --check-build banner when nothing was built
