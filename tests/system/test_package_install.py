"""The package as users install it into an environment they already have: sdist and wheel build, the wheel
installs with its declared dependencies next to a torch that is already there (as a cluster module or a
container provides it) and leaves that torch alone, and the console script runs without Horovod (doctor says
how to build it). One version, written in pyproject.toml alone."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE", "horovod_train")


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
    assert {"horovod_train/configs/demo.yaml", "horovod_train/mpirun_flags.txt"} <= names
    assert "License-Expression: Apache-2.0" in metadata
    requires = re.findall(r"(?m)^Requires-Dist: ([A-Za-z0-9_.-]+)(.*)$", metadata)
    runtime = {name.lower() for name, rest in requires if "extra ==" not in rest}
    assert {"torch", "transformers", "datasets", "evaluate", "safetensors", "tokenizers"} <= runtime
    assert not any(name.lower() == "horovod" for name, _ in requires), "Horovod must be built, not pip-required"
    assert "horovod-train = horovod_train.cli:main" in entry_points
    if importlib.util.find_spec("build"):
        (sdist,) = built["dist"].glob(f"horovod_train-{version}.tar.gz")
        with tarfile.open(sdist) as tar:
            members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
        assert {"LICENSE", "pyproject.toml", "README.md", "horovod_train/cli.py"} <= members


@pytest.mark.slow
def test_wheel_installs_next_to_an_existing_torch(built: dict[str, Path]) -> None:
    tmp = built["tmp"]
    module = cluster_torch_module(tmp / "torch-module")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(run([str(python), "-c", purelib], cwd=tmp).stdout.strip())
    (site / "cluster-torch-module.pth").write_text(f"{module}\n")
    (wheel,) = built["dist"].glob("*.whl")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", str(wheel)], cwd=tmp, timeout=540)

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
        "{train,compare,doctor,bench,build-horovod}"
        in run([str(venv / "bin" / "horovod-train"), "--help"], cwd=tmp).stdout
    )
    doctor = run([str(venv / "bin" / "horovod-train"), "doctor"], cwd=tmp).stdout
    assert "horovod: not importable" in doctor
    assert "horovod-train build-horovod" in doctor
    assert "scripts/build_horovod.sh" in doctor and f"PYTHON={python}" in doctor
    assert "joined with engine single" in doctor
    assert f"horovod-train {project_version()} ({site / 'horovod_train'})" in doctor
