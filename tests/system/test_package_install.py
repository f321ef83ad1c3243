"""The package as users install it into an environment they already have: sdist and wheel build, the wheel
installs with its declared dependencies next to a torch that is already there (as a cluster module or a
container provides it) and leaves that torch alone, the console script runs without Horovod (doctor says
how to build it), then `horovod-train build-horovod` builds Horovod there and the demo runs under its
`horovodrun`. One version, written in pyproject.toml alone.

build-horovod uses the machine's wheel cache (~/.cache/horovod-train/wheels, as `make setup` filled it), so it
installs a cached wheel rather than compiling, with no build tools in the environment (no wheel module, no pip
cmake): the environment's test is pip installs, two build-horovod runs and the demo's 2 ranks."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from horovod_train.build_horovod.plan import cache_root
from horovod_train.cli.main import COMMANDS

REPO = Path(__file__).resolve().parents[2]

PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE", "horovod_train")
BUILD_TOOLS = ["cmake<5", "setuptools", "wheel"]


def project_version() -> str:
    found = re.search(r'(?m)^version = "([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert found, "pyproject.toml has no version"
    return found[1]


def clean_env() -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH pointing at this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(
    cmd: list[str], cwd: Path, timeout: int = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = clean_env() if env is None else env
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def copy_sources(dest: Path) -> Path:
    """The files a build reads, copied, so that building leaves nothing (build/, *.egg-info) in the checkout."""
    dest.mkdir()
    for name in PACKAGE_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def module_closure(name: str, seen: set[str]) -> None:
    """``name`` and what it requires (no extras, no markers), by distribution name."""
    dist = importlib.metadata.distribution(name)
    key = dist.metadata["Name"].lower()
    if key in seen:
        return
    seen.add(key)
    for req in dist.requires or []:
        if ";" not in req:
            module_closure(re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0], seen)


def cluster_torch_module(dest: Path) -> Path:
    """A directory holding torch and what it requires, linked from the running environment, as a cluster's
    `module load pytorch` or a container's site-packages provides it; a .pth file puts it on a venv's path."""
    dest.mkdir()
    names: set[str] = set()
    module_closure("torch", names)
    for name in names:
        dist = importlib.metadata.distribution(name)
        for top in {str(f).split("/")[0] for f in dist.files or []} - {".."}:
            src = Path(str(dist.locate_file(top)))
            if src.exists() and not (dest / top).exists():
                (dest / top).symlink_to(src)
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The wheel (and, where `build` is installed, the sdist too) of a copy of this checkout."""
    tmp = tmp_path_factory.mktemp("package")
    src, dist = copy_sources(tmp / "src"), tmp / "dist"
    if importlib.util.find_spec("build"):
        run([sys.executable, "-m", "build", "--outdir", str(dist), str(src)], cwd=tmp, env=dict(os.environ))
    else:  # requirements-dev.txt installs build; until then, the wheel alone
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(src)], cwd=tmp)
    return {"dist": dist, "tmp": tmp}


def test_source_checkout_not_installed_reads_pyproject(tmp_path: Path) -> None:
    # python -S: no site-packages, so no installed horovod-train metadata. A copy of the checkout's sources on
    # PYTHONPATH: the checkout itself may hold a horovod_train.egg-info (pip install -e ., a wheel built there),
    # which is installed metadata again.
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "horovod_train", checkout / "horovod_train")
    shutil.copy(REPO / "pyproject.toml", checkout / "pyproject.toml")
    env = {**clean_env(), "PYTHONPATH": str(checkout)}
    proc = subprocess.run(
        [sys.executable, "-S", "-c", "import horovod_train; print(horovod_train.__version__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{project_version()}+source"


@pytest.mark.slow
def test_wheel_and_sdist_contents(built: dict[str, Path]) -> None:
    version = project_version()
    wheels = list(built["dist"].glob(f"horovod_train-{version}-py3-none-any.whl"))
    assert len(wheels) == 1, sorted(built["dist"].iterdir())
    with zipfile.ZipFile(wheels[0]) as whl:
        names = set(whl.namelist())
        metadata = whl.read(f"horovod_train-{version}.dist-info/METADATA").decode()
        entry_points = whl.read(f"horovod_train-{version}.dist-info/entry_points.txt").decode()
    assert f"horovod_train-{version}.dist-info/licenses/LICENSE" in names
    assert {"horovod_train/configs/demo.yaml", "horovod_train/launching/mpirun_flags.txt"} <= names
    assert "License-Expression: Apache-2.0" in metadata
    requires = re.findall(r"(?m)^Requires-Dist: ([A-Za-z0-9_.-]+)(.*)$", metadata)
    runtime = {name.lower() for name, rest in requires if "extra ==" not in rest}
    assert {"torch", "transformers", "datasets", "evaluate", "safetensors", "tokenizers"} <= runtime
    assert not any(name.lower() == "horovod" for name, _ in requires), "Horovod must be built, not pip-required"
    assert "horovod-train = horovod_train.cli.main:main" in entry_points
    extras = set(re.findall(r"(?m)^Provides-Extra: (\S+)$", metadata))
    assert {"mpi", "tensorboard", "wandb", "mlflow", "trackers", "peft", "dev"} <= extras, extras
    if importlib.util.find_spec("build"):
        (sdist,) = built["dist"].glob(f"horovod_train-{version}.tar.gz")
        with tarfile.open(sdist) as tar:
            members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
        assert {"LICENSE", "pyproject.toml", "README.md", "horovod_train/cli/main.py"} <= members


def user_env(venv: Path, **extra: str) -> dict[str, str]:
    """A shell with the new environment activated: nothing of this checkout or of .venv on the paths."""
    env = {k: v for k, v in clean_env().items() if k != "HOROVOD_TRAIN_CACHE"}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != Path(sys.executable).parent]
    return env | {"PATH": os.pathsep.join([str(venv / "bin"), *path]), "VIRTUAL_ENV": str(venv), **extra}


def build_horovod(venv: Path, wheel_cache: Path, *args: str) -> str:
    cmd = [str(venv / "bin" / "horovod-train"), "build-horovod", *args]
    return run(cmd, venv.parent, timeout=1500, env=user_env(venv, HOROVOD_WHEEL_CACHE=str(wheel_cache))).stdout


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_wheel_next_to_an_existing_torch_then_build_horovod_and_the_demo(built: dict[str, Path]) -> None:
    """One environment, as a user's goes: the wheel next to the cluster's torch (pip leaves that torch alone);
    doctor says Horovod is missing and how to build it; `horovod-train build-horovod` builds it for that torch
    (or installs this machine's cached wheel when the key matches); the demo runs under its `horovodrun -np 2`.

    HVT_BUILD_HOROVOD_COLD=1 points build-horovod at an empty cache: a real build from the sdist (PyPI), about
    11 min on the loaded 2-core machine; not in `make test`'s budget."""
    tmp = built["tmp"]
    module = cluster_torch_module(tmp / "torch-module")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp)
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(run([str(python), "-c", purelib], cwd=tmp).stdout.strip())
    (site / "cluster-torch-module.pth").write_text(f"{module}\n")
    (wheel,) = built["dist"].glob("*.whl")
    run([str(python), "-m", "pip", "install", "-q", str(wheel)], cwd=tmp, timeout=540, env=user_env(venv))

    probe = (
        "import torch, transformers, datasets, evaluate, safetensors, tokenizers, matplotlib, yaml, horovod_train;"
        "print(horovod_train.__version__); print(horovod_train.__file__); print(torch.__file__)"
    )
    version, package_file, torch_file = run([str(python), "-c", probe], cwd=tmp).stdout.split()
    assert version == project_version()
    assert Path(package_file).is_relative_to(site), package_file
    assert Path(torch_file).parent.parent == module, f"pip replaced the environment's torch: {torch_file}"
    assert not (site / "torch").exists()

    assert (
        "{" + ",".join(COMMANDS) + "}"  # the installed console script lists every command of the table
        in run([str(venv / "bin" / "horovod-train"), "--help"], cwd=tmp).stdout
    )
    doctor = run([str(venv / "bin" / "horovod-train"), "doctor"], cwd=tmp).stdout
    assert "horovod: not importable" in doctor
    assert "horovod-train build-horovod" in doctor
    assert "scripts/build_horovod.sh" in doctor and f"PYTHON={python}" in doctor
    assert "joined with engine single" in doctor
    assert f"horovod-train {project_version()} ({site / 'horovod_train'})" in doctor
    use_peft_without_the_extra(venv)

    cold = os.environ.get("HVT_BUILD_HOROVOD_COLD") == "1"
    wheel_cache = tmp / "empty-wheel-cache" if cold else cache_root()
    key = f"horovod-0.28.1-torch2.13.0_cpu-cudacpu-cp3{sys.version_info[1]}"
    cached = any((wheel_cache / key).glob("horovod-*.whl"))
    if not cached:  # a build needs them (build-horovod names each, one line, when missing); a cached wheel does not
        run([str(python), "-m", "pip", "install", "-q", *BUILD_TOOLS], cwd=tmp, timeout=540, env=user_env(venv))
    plan = build_horovod(venv, wheel_cache, "--dry-run")
    assert f"cache key:  {key}" in plan and f"python:     {python}" in plan, plan
    assert ("install the cached wheel" if cached else "build (no cached wheel)") in plan, plan
    assert ("not needed (no build)" in plan) == cached, plan
    assert not list(site.glob("horovod")), "a dry run installed something"

    start = time.monotonic()
    first = build_horovod(venv, wheel_cache)
    print(f"build-horovod ({'cache hit' if cached else 'built'}): {time.monotonic() - start:.0f} s")
    for item in ("[X] PyTorch", "[X] Gloo", "[X] MPI"):  # horovodrun runs: Horovod's requirements came with it
        assert item in first, first
    assert any((wheel_cache / key).glob("horovod-*.whl")), "the wheel was not cached"
    again = build_horovod(venv, wheel_cache)
    assert "(PyTorch, Gloo, MPI) already installed for" in again and "nothing to build" in again, again
    assert "Available Frameworks" not in again, again  # the --check-build banner only when built or installed

    probe = "import horovod, horovod.torch, torch; print(horovod.__file__); print(torch.__file__)"
    horovod_file, torch_file = run([str(python), "-c", probe], cwd=tmp, env=user_env(venv)).stdout.split()
    assert Path(horovod_file).is_relative_to(site) and Path(torch_file).parent.parent == module
    demo_under_horovodrun(venv)


def use_peft_without_the_extra(venv: Path) -> None:
    """peft is the `peft` extra, not installed here: --use_peft is one line naming it, exit 2, nothing written."""
    out = venv.parent / "lora-run"
    cmd = [str(venv / "bin" / "horovod-train"), "train", "--use_peft", "--output_dir", str(out)]
    proc = subprocess.run(cmd, cwd=venv.parent, env=user_env(venv), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip().splitlines() == [
        "error: --use_peft needs the peft package (not installed); "
        "fix: pip install 'horovod-train[peft]' (or pip install peft), or drop --use_peft"
    ], proc.stderr[-2000:]
    assert not out.exists()


def demo_under_horovodrun(venv: Path) -> None:
    """The packaged demo config, a few steps, 2 ranks, the environment's own horovodrun and console script."""
    find = "import horovod_train, pathlib; print(pathlib.Path(horovod_train.__file__).parent / 'configs/demo.yaml')"
    config = run([str(venv / "bin" / "python"), "-c", find], venv.parent, env=user_env(venv)).stdout.strip()
    out = venv.parent / "demo-run"
    job = ["--config", config, "--max_steps", "6", "--synthetic_num_examples", "400", "--logging_steps", "2"]
    job += ["--output_dir", str(out), "--overwrite_output_dir", "--disable_tqdm"]
    cmd = [str(venv / "bin" / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo"]
    cmd += [str(venv / "bin" / "horovod-train"), "train", *job]
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env = user_env(venv, HOROVOD_TRAIN_CACHE=str(venv.parent / "hvt-cache"), **offline)
    proc = run(cmd, venv.parent, timeout=900, env=env)
    last = proc.stdout.strip().splitlines()[-1]
    assert "horovod, world size 2" in last, proc.stdout[-3000:]
    assert (out / "all_results.json").is_file()
