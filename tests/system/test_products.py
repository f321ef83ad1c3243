"""The GPU-node check is a product of its own: built into a wheel, installed outside any checkout, it runs
(`python -m horovod_train.gpucheck`) with nothing of the repository on its path or in its directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from support.jobs import BIN, REPO, base_env

PYTHON = str(BIN / "python")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The package built as a wheel from a copy of its sources and installed with --target: the folder."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "horovod_train", source / "horovod_train", ignore=shutil.ignore_patterns("__pycache__"))
    build = [PYTHON, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root), str(source)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    (wheel,) = root.glob("horovod_train-*.whl")
    target = root / "site"
    install = [PYTHON, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    return target


def outside_env(target: Path, cache_dir: Path) -> dict[str, str]:
    """PYTHONPATH: the installed wheel, then the venv's packages; nothing of the checkout (the venv's
    editable install of the project is a .pth file, which ``python -S`` does not read)."""
    env = base_env(cache_dir)
    env.update(PYTHONPATH=f"{target}:{sysconfig.get_paths()['purelib']}", HVT_GPU_CHECK_DRY="1")
    env.pop("OUT", None)
    return env


def gpucheck(target: Path, cache_dir: Path, cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [PYTHON, "-S", "-m", "horovod_train.gpucheck", *args]
    env = outside_env(target, cache_dir)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_holds_the_gpu_check_and_python_imports_it_from_there(installed, cache_dir, tmp_path):
    where = "import horovod_train.gpucheck.check as c, horovod_train as h; print(c.__file__, h.__file__)"
    for flags in (["-S"], []):  # the check itself, and the python of its steps (which reads the .pth files)
        cmd = [PYTHON, *flags, "-c", where]
        env = outside_env(installed, cache_dir)
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert all(Path(f).is_relative_to(installed) for f in proc.stdout.split()), (flags, proc.stdout)


def test_help_runs_outside_a_checkout(installed, cache_dir, tmp_path):
    proc = gpucheck(installed, cache_dir, tmp_path, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: gpu_check" in proc.stdout and "--scripts_dir" in proc.stdout and "--dry_run" in proc.stdout


def test_without_the_checkout_scripts_the_horovod_steps_are_one_line_usage_error(installed, cache_dir, tmp_path):
    out = tmp_path / "out"
    proc = gpucheck(installed, cache_dir, tmp_path, "--output_dir", str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: no --scripts_dir for build_horovod.sh")
    assert "fix: pass --scripts_dir" in proc.stderr and not out.exists()  # nothing written
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = gpucheck(installed, cache_dir, tmp_path, "--output_dir", str(out), "--scripts_dir", str(empty))
    assert proc.returncode == 2 and f"--scripts_dir {empty} has no build_horovod.sh" in proc.stderr
    proc = gpucheck(installed, cache_dir, tmp_path, "--output_dir", str(out), "--steps", "environment,nope")
    assert proc.returncode == 2 and proc.stderr.startswith("error: unknown step(s) nope; fix: use [")
    assert not out.exists()


@pytest.mark.slow
def test_a_dry_run_trains_the_packaged_demo_outside_a_checkout(installed, cache_dir, tmp_path):
    """Horovod np=1 through horovodrun, the demo config from the wheel's package data."""
    out = tmp_path / "out"
    steps = "environment,horovod_demo"
    args = ("--dry_run", "--steps", steps, "--output_dir", str(out), "--work_dir", str(tmp_path / "work"))
    proc = gpucheck(installed, cache_dir, tmp_path, *args, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads((out / "gpu_check.json").read_text())
    assert [(s["name"], s["status"]) for s in report["steps"]] == [("environment", "ok"), ("horovod_demo", "ok")]
    demo = report["steps"][1]
    assert "demo" in demo["cmd"] and demo["metrics"]["engine"] == "horovod"
    assert demo["metrics"]["last_loss"] < demo["metrics"]["first_loss"]
