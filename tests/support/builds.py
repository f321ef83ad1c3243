"""The suite's long builds, started as soon as the session knows it needs them and run in the background beside the
other tests (issue 40): the NCCL build's environment and the CPU image, then the GPU image, which seeds the NCCL
build's wheel and takes the CPU image's OS, MPI and torch-free requirements layers from Podman's cache. Much of
their time is downloads, layer copies and commits, which the tests' CPU work fills.

A test module asks for one with ``pytestmark = pytest.mark.builds("gpu-image")``: its tests are moved to the end of
the session (in their random order), the build starts when collection ends, and the module's fixture calls
``result(name)``, which waits for it. A build that fails fails the tests that need it, with its log. Each build
runs in a process group of its own, killed when the session ends, when the session's images are removed too (each
variant's newest build first kept as the machine's build cache: support/docker.py). Where a precondition is missing
(not root, no podman, no nvcc), nothing starts in the background and the fixture's own checks skip or fail as before.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from support.clock import reap_background
from support.docker import PODMAN_BUILD, podman_env, podman_tools, remove_session_image
from support.jobs import BIN, REPO
from support.machine import SESSION
from support.nccl import SCRIPT as NCCL_SCRIPT
from support.nccl import have_nvcc

IMAGE = f"localhost/horovod-train-test-{SESSION}"  # this session's images (:cpu, :gpu): another run tags its own


@dataclass
class Build:
    name: str
    after: str | None  # a build whose output this one uses (the GPU image seeds the NCCL build's wheel)
    timeout: float
    # Builds that go first when the session wants them too, not built for this one: the images share their OS, MPI
    # and torch-free requirements layers (docker/Dockerfile), which the second build takes from Podman's cache only
    # if the first made them.
    follows: tuple[str, ...] = ()
    done: threading.Event = field(default_factory=threading.Event)
    result: subprocess.CompletedProcess | None = None
    seconds: float = 0.0
    process: subprocess.Popen | None = None
    thread: threading.Thread | None = None

    def command(self) -> tuple[list[str], dict[str, str]] | None:
        """The command and its environment, or None where it cannot run here (the fixture says why)."""
        if self.name == "nccl":
            return (["bash", str(NCCL_SCRIPT)], dict(os.environ)) if have_nvcc() else None
        if os.geteuid() != 0 or not all(shutil.which(tool) for tool in podman_tools()):
            return None
        env = {**podman_env(BIN / "python"), "HVT_IMAGE": IMAGE}
        variant = ["--variant", "gpu"] if self.name == "gpu-image" else []
        return [str(PODMAN_BUILD), "build", *variant, "--seed-horovod-wheel"], env


BUILDS = {
    "nccl": Build("nccl", after=None, timeout=1700),
    "gpu-image": Build("gpu-image", after="nccl", timeout=3300, follows=("cpu-image",)),
    "cpu-image": Build("cpu-image", after=None, timeout=1500),
}
LOG_DIR = Path(tempfile.mkdtemp(prefix=f"hvt-builds-{SESSION}-"))


def _run(build: Build) -> None:
    argv: list[str] = [build.name]
    try:
        if build.after is not None:
            BUILDS[build.after].done.wait()
        for name in build.follows:
            if BUILDS[name].thread is not None:
                BUILDS[name].done.wait()
        found = build.command()
        if found is None:
            return
        argv, env = found
        log = LOG_DIR / f"{build.name}.log"
        start = time.monotonic()
        with log.open("w") as out:
            build.process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                                             start_new_session=True)  # fmt: skip
            while (code := reap_background(build.name, build.process, start)) is None:
                if time.monotonic() - start > build.timeout:
                    stop(build)
                    code = -signal.SIGKILL
                    break
                time.sleep(1.0)
        build.seconds = time.monotonic() - start
        build.result = subprocess.CompletedProcess(argv, code, log.read_text(errors="replace"), "")
    except Exception:  # noqa: BLE001 - the fixture that waits for the build shows why it could not run
        build.result = subprocess.CompletedProcess(argv, -1, "", traceback.format_exc())
    finally:
        build.done.set()


def start(names: set[str]) -> None:
    """Start ``names`` and what they need, each once."""
    wanted = set(names)
    for name in names:
        after = BUILDS[name].after
        while after is not None:
            wanted.add(after)
            after = BUILDS[after].after
    new = [BUILDS[name] for name in sorted(wanted) if BUILDS[name].thread is None]
    for build in new:  # every thread made before any starts: a build sees which of its `follows` this session runs
        build.thread = threading.Thread(target=_run, args=(build,), name=f"build-{build.name}", daemon=True)
    for build in new:
        build.thread.start()


def result(name: str) -> subprocess.CompletedProcess | None:
    """The build's result once it ended (started now if the session did not start it); None: it cannot run here."""
    start({name})
    build = BUILDS[name]
    build.done.wait()
    if build.result is not None:
        print(f"\n[{name}: {build.seconds:.1f} s in the background]")
    return build.result


def stop(build: Build) -> None:
    if build.process is not None and build.process.poll() is None:
        os.killpg(build.process.pid, signal.SIGKILL)
        build.process.wait()


def stop_all() -> None:
    for build in BUILDS.values():
        stop(build)
    for name, variant in (("cpu-image", "cpu"), ("gpu-image", "gpu")):
        if BUILDS[name].process is not None:  # podman build ran here: its image may be tagged, its module not run
            remove_session_image(IMAGE, variant, dict(os.environ))
    shutil.rmtree(LOG_DIR, ignore_errors=True)
