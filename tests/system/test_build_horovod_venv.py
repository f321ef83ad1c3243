"""`horovod-train build-horovod` as a user runs it: a new virtual environment (no system site-packages) gets
torch==2.13.0 (CPU, the local wheel pip's configuration finds, as `make setup` installs it) and the project's own
wheel; the command there builds Horovod for that torch (or installs the machine's cached wheel when the key
matches), prints `horovodrun --check-build`, says "already installed" the second time, and the demo job runs
under that environment's `horovodrun -np 2`.

The wheel cache is the machine's (~/.cache/horovod-train/wheels, as `make setup` filled it), so a run is pip
installs and no compiling: 9 min in all on the shared 2-core machine (build-horovod itself, a cache hit, 71 s).
HVT_BUILD_HOROVOD_COLD=1 points the command at an empty cache: a real build from the sdist (PyPI), 10.7 min
wall (4.6 min CPU, 2 jobs) on that loaded machine; not in `make test`'s budget."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.jobs import REPO

from horovod_train.build_horovod.plan import cache_root

TORCH = "torch==2.13.0"  # requirements.txt's pin: the CPU wheel in pip's find-links on this machine
BUILD_TOOLS = ["cmake<5", "setuptools", "wheel"]
PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE", "horovod_train")


def run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    detail = f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, detail
    return proc


def user_env(venv: Path, **extra: str) -> dict[str, str]:
    """A shell with the new environment activated: nothing of this checkout or of .venv on the paths."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "HOROVOD_TRAIN_CACHE")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != Path(sys.executable).parent]
    env |= {"PATH": os.pathsep.join([str(venv / "bin"), *path]), "VIRTUAL_ENV": str(venv)}
    return env | {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "OMP_NUM_THREADS": "1", **extra}


def project_wheel(tmp: Path) -> Path:
    """`python -m build --wheel` of a copy of the checkout (building leaves nothing in the checkout)."""
    src = tmp / "src"
    src.mkdir()
    for name in PACKAGE_FILES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp / "dist"), str(src)], env, tmp)
    (wheel,) = (tmp / "dist").glob("horovod_train-*.whl")
    return wheel


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("build-horovod")
    wheel = project_wheel(tmp)
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)], user_env(venv), tmp)
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", TORCH, str(wheel)]
    run([*pip, *BUILD_TOOLS], user_env(venv), tmp, timeout=1500)  # 4 min on a quiet machine, 10+ under load
    return venv


def build_horovod(venv: Path, wheel_cache: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(venv / "bin" / "horovod-train"), "build-horovod", *args]
    return run(cmd, user_env(venv, HOROVOD_WHEEL_CACHE=str(wheel_cache)), venv.parent, timeout=1500)


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_build_horovod_in_a_fresh_environment_then_the_demo_under_horovodrun(fresh_venv: Path) -> None:
    venv = fresh_venv
    cold = os.environ.get("HVT_BUILD_HOROVOD_COLD") == "1"
    wheel_cache = venv.parent / "empty-wheel-cache" if cold else cache_root()
    plan = build_horovod(venv, wheel_cache, "--dry-run").stdout
    key = f"horovod-0.28.1-torch2.13.0_cpu-cudacpu-cp3{sys.version_info[1]}"
    assert f"cache key:  {key}" in plan and f"python:     {venv / 'bin' / 'python'}" in plan, plan
    cached = any((wheel_cache / key).glob("horovod-*.whl"))
    assert ("install the cached wheel" if cached else "build (no cached wheel)") in plan, plan
    assert not list(venv.glob("lib/python*/site-packages/horovod")), "a dry run installed something"

    start = time.monotonic()
    first = build_horovod(venv, wheel_cache).stdout
    print(f"build-horovod ({'cache hit' if cached else 'built'}): {time.monotonic() - start:.0f} s")
    for item in ("[X] PyTorch", "[X] Gloo", "[X] MPI"):  # horovodrun runs: Horovod's requirements came with it
        assert item in first, first
    assert any((wheel_cache / key).glob("horovod-*.whl")), "the wheel was not cached"
    again = build_horovod(venv, wheel_cache).stdout
    assert "nothing to build: already installed" in again and "[X] PyTorch" in again, again

    probe = "import horovod, horovod.torch, torch; print(horovod.__file__); print(torch.__file__)"
    files = run([str(venv / "bin" / "python"), "-c", probe], user_env(venv), venv.parent).stdout.split()
    assert all(Path(f).is_relative_to(venv) for f in files), files
    demo_under_horovodrun(venv)


def demo_under_horovodrun(venv: Path) -> None:
    """The packaged demo config, a few steps, 2 ranks, the environment's own horovodrun and console script."""
    find = "import horovod_train, pathlib; print(pathlib.Path(horovod_train.__file__).parent / 'configs/demo.yaml')"
    config = run([str(venv / "bin" / "python"), "-c", find], user_env(venv), venv.parent).stdout.strip()
    out = venv.parent / "demo-run"
    job = ["--config", config, "--max_steps", "6", "--synthetic_num_examples", "400", "--logging_steps", "2"]
    job += ["--output_dir", str(out), "--overwrite_output_dir", "--disable_tqdm"]
    cmd = [str(venv / "bin" / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo"]
    cmd += [str(venv / "bin" / "horovod-train"), "train", *job]
    env = user_env(venv, HOROVOD_TRAIN_CACHE=str(venv.parent / "hvt-cache"), HF_HUB_OFFLINE="1")
    proc = run(cmd, env | {"HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, venv.parent, timeout=900)
    last = proc.stdout.strip().splitlines()[-1]
    assert "horovod, world size 2" in last, proc.stdout[-3000:]
    assert (out / "all_results.json").is_file()
