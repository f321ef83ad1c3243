"""The cached wheel into the environment, and what is installed there checked: `horovodrun --check-build`."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from horovod_train.build_horovod.build import MARK, SUMS
from horovod_train.build_horovod.plan import Plan
from horovod_train.build_horovod.progress import stage
from horovod_train.common.console import write_line
from horovod_train.common.digest import sha256
from horovod_train.common.errors import UsageError

# Run in the target's interpreter (a fresh process: this one must not hold the Horovod it may replace).
INSTALLED_PROBE = """
import sys, horovod, horovod.torch as hvd  # the extension must load, not just the package
built = [horovod.__version__, *(str(int(bool(f()))) for f in (hvd.mpi_built, hvd.nccl_built, hvd.gloo_built))]
sys.exit(0 if built == sys.argv[1:] else 1)
"""


def mark_file(plan: Plan) -> Path:
    return plan.target.prefix / MARK


def already_installed(plan: Plan) -> bool:
    """This key's Horovod is what the environment has: recorded by the last install, and it imports as built with
    what `check_build` asks of `horovodrun --check-build` (PyTorch: the extension loads; Gloo; MPI, NCCL if planned),
    so a run that finds it needs no --check-build."""
    mark = mark_file(plan)
    if not mark.is_file() or mark.read_text().strip() != plan.key:
        return False
    built = [str(int(plan.mpi)), str(int(plan.nccl)), "1"]
    probe = [plan.target.python, "-c", INSTALLED_PROBE, plan.version, *built]
    return subprocess.run(probe, capture_output=True).returncode == 0


def cached_wheel(plan: Plan) -> Path | None:
    wheels = sorted(plan.wheel_dir.glob("horovod-*.whl"))
    return wheels[-1] if wheels else None


def verify_digest(wheel: Path) -> None:
    """The digest recorded when the wheel was built (scripts/podman_build.sh copies both into an image's cache)."""
    sums = wheel.parent / SUMS
    if not sums.is_file():
        return
    recorded = dict(reversed(line.split(maxsplit=1)) for line in sums.read_text().splitlines() if line.strip())
    if recorded.get(wheel.name) != sha256(wheel):
        raise UsageError(f"the Horovod wheel {wheel} does not match the {SUMS} recorded when it was built",
                         f"remove {wheel.parent} (or rerun with --force) to build it again")  # fmt: skip


def install_wheel(plan: Plan, wheel: Path) -> None:
    verify_digest(wheel)
    pip = [plan.target.python, "-m", "pip", "install", "-q"]
    with stage(f"installing {wheel}"):
        subprocess.run([*pip, "--no-deps", "--force-reinstall", str(wheel)], check=True)
        # Then Horovod's own requirements (cloudpickle, psutil, pyyaml, packaging) where missing: the reinstall above
        # leaves every other package as it is, and this one asks an index only for what is not installed.
        subprocess.run([*pip, str(wheel)], check=True)
    with contextlib.suppress(OSError):  # a read-only prefix keeps no record: the next run installs again
        mark_file(plan).write_text(plan.key + "\n")


def expected_features(plan: Plan) -> list[str]:
    return ["PyTorch", "Gloo", *(["MPI"] if plan.mpi else []), *(["NCCL"] if plan.nccl else [])]


def installed_line(plan: Plan) -> str:
    """The one line for a Horovod found installed as planned (its --check-build banner is printed when it is built
    or installed, not on every `make setup`)."""
    return (
        f"[horovod] {plan.version} ({', '.join(expected_features(plan))}) already installed for {plan.target.python}: "
        "nothing to build (`horovod-train build-horovod --dry-run` shows the plan)"
    )


def check_build(plan: Plan) -> None:
    """Print `horovodrun --check-build` and fail unless it lists what this build was asked for."""
    horovodrun = plan.target.bin_dir / "horovodrun"
    report = subprocess.run([str(horovodrun), "--check-build"], capture_output=True, text=True, check=True).stdout
    write_line(report.rstrip())
    missing = [item for item in expected_features(plan) if f"[X] {item}" not in report]
    if missing:
        raise UsageError(f"horovodrun --check-build does not list {', '.join(missing)}",
                         "rebuild Horovod: horovod-train build-horovod --force")  # fmt: skip
