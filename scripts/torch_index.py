"""Which index `make setup` installs torch from (scripts/setup.sh): PyPI's torch for Linux x86_64 is the CUDA
build (GBs of CUDA libraries a machine without a GPU never loads); such a machine gets the CPU build from PyTorch's
CPU index instead, as an extra index for torch alone. Where the default index already gives a CPU build (a local
wheel, a mirror, macOS), or where pip cannot tell, the default stays. ``TORCH_INDEX_URL`` decides instead when set
(empty: the default index). Standard library only.

Prints two lines: the extra index URL (empty for the default) and the line setup shows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def gpu_visible() -> bool:
    """An NVIDIA GPU this machine can use: nvidia-smi exists and lists one (it fails without a driver)."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def default_version(python: str, requirement: str) -> str | None:
    """The torch version pip would install from the configured indexes (metadata only, nothing installed); None
    where pip cannot tell (offline)."""
    ask = [python, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet", "--report", "-",
           requirement]  # fmt: skip
    try:
        done = subprocess.run(ask, capture_output=True, text=True, timeout=600)
        return json.loads(done.stdout)["install"][0]["metadata"]["version"] if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, IndexError):
        return None


def choose(override: str | None, gpu: bool, version: str | None) -> tuple[str, str]:
    """(the extra index for torch, "" for the default; the line setup prints)."""
    if override is not None:
        return override, f"torch from {override or 'the default index'} (TORCH_INDEX_URL)"
    if gpu:
        return "", "torch: a GPU is visible (nvidia-smi), the default index's CUDA build"
    if version is None:
        return "", "torch: no GPU, but pip cannot tell which build the default index has: keeping it"
    if "+cpu" in version:
        return "", f"torch: no GPU, and the default index's torch {version} is the CPU build"
    return CPU_INDEX, f"torch: no GPU (nvidia-smi missing or failing): the CPU build, from {CPU_INDEX}"


def main(python: str, requirement: str) -> None:
    override = os.environ.get("TORCH_INDEX_URL")
    gpu = override is None and gpu_visible()
    version = None if override is not None or gpu else default_version(python, requirement)
    print("\n".join(choose(override, gpu, version)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
