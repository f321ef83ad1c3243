"""Config: run_glue-style arguments, YAML/JSON --config, CLI over config, unknown keys refused."""

from __future__ import annotations


def test_a_wheel_ships_the_demo_config_and_the_mpirun_flags(tmp_path):
    """What a non-editable install gets: the files the package reads at run time."""
    import shutil
    import subprocess
    import sys
    import zipfile

    from support.jobs import REPO

    source = tmp_path / "src"  # a copy: setuptools builds in place and would leave build/ in the checkout
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "runs", "*.egg-info"))
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path)]
    subprocess.run([*build, str(source)], check=True, capture_output=True, timeout=300)
    names = zipfile.ZipFile(next(tmp_path.glob("horovod_train-*.whl"))).namelist()
    for shipped in ("configs/demo.yaml", "launching/mpirun_flags.txt", "tasks/evaluate_modules/accuracy/accuracy.py"):
        assert f"horovod_train/{shipped}" in names
