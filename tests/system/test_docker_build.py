"""docker/Dockerfile built and run for real, with Podman (Debian's podman 4.3, no Docker engine and no registry
needed): scripts/podman_build.sh builds the CPU variant (base image from mmdebstrap, the host's torch CPU wheel
through a local index, the host's Horovod wheel seeded into the build cache), then two containers of the image
act as two hosts on a podman network, each running the entry point's sshd (HVT_SSHD=1, SSH_PORT=2222, a
throwaway key pair mounted at /root/.ssh), and the launch/ scripts inside the image train 2 ranks across them:
horovodrun with the Gloo and the MPI controller, and mpirun. The image's build already proves what
tests/system/test_docker_static.py no longer checks: every COPY source exists, the shared scripts run in order,
`horovodrun --check-build` lists PyTorch, MPI and Gloo, sshd accepts docker/sshd_config.

Measured on the 2-core test machine while other test suites ran (load 5-8): 6.6 minutes with no image and no
build cache (build 5.1 min with the seeded wheel, the podman packages already installed), about 2 minutes when the
machine kept its images (every layer but the project's own is cached); the training runs dominate then."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import builds
from support.docker import podman_tools, remove_session_image
from support.jobs import BIN, REPO, assert_ok, read_results
from support.launch import LAUNCH_JOB, effective_command, ensure_commands, rank_map
from support.machine import SESSION

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.builds("cpu-image")]

SCRIPT = REPO / "scripts" / "podman_build.sh"
# This session's own image name and containers: another test run on the machine builds, tags and removes its own.
IMAGE = builds.IMAGE
TAG = f"{IMAGE}:cpu"
PREFIX = f"hvttest-{SESSION}"
SSH_PORT = 2222
HOSTS = "nodea:1,nodeb:1"
# The ranks' environment (podman exec -e); the launchers forward it to the rank on the other container.
RANK_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# podman's environment: CONTAINERS_CONF is the file scripts/podman_build.sh writes (runc, accepted ulimits).
PODMAN_ENV: dict[str, str] = {}


def script(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "HVT_PYTHON": str(BIN / "python"), "HVT_IMAGE": IMAGE, **PODMAN_ENV}
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout)


def podman(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], env=PODMAN_ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("building with podman and creating container networks needs root here")
    ensure_commands(podman_tools())
    conf = script("conf", timeout=60)
    assert_ok(conf)
    PODMAN_ENV.update(os.environ, CONTAINERS_CONF=conf.stdout.strip().splitlines()[-1])
    try:
        proc = builds.result("cpu-image")  # `build --seed-horovod-wheel`, begun when the session started
        assert proc is not None, "the CPU image's build could not start (see support/builds.py)"
        assert_ok(proc)  # tags :cpu and :VERSION-cpu
        yield TAG
    finally:
        remove_session_image(IMAGE, "cpu", PODMAN_ENV)


@pytest.fixture(scope="module")
def containers(image, tmp_path_factory) -> Iterator[Path]:
    """Two containers as two hosts; ``/out`` in both is this directory (rank 0 writes the results there)."""
    out = tmp_path_factory.mktemp("containers")
    try:
        proc = script(
            "up",
            "--prefix",
            PREFIX,
            "--tag",
            image,
            "--ssh-port",
            str(SSH_PORT),
            "--volume",
            f"{out}:/out",
            timeout=180,
        )
        assert_ok(proc)
        yield out
    finally:
        script("down", "--prefix", PREFIX, timeout=180)  # this session's containers, network and keys alone


def on_a(*cmd: str, env: dict[str, str] | None = None, timeout: float = 480) -> subprocess.CompletedProcess:
    """Run ``cmd`` in the first container (in the image's WORKDIR, /opt/horovod-train)."""
    pairs = {**RANK_ENV, **(env or {})}
    return podman("exec", *[a for name, value in pairs.items() for a in ("-e", f"{name}={value}")], f"{PREFIX}-a", *cmd,
                  timeout=timeout)  # fmt: skip


def train(name: str, launcher: list[str], out: Path, controller: str) -> str:
    """A 2-rank training run under ``launcher`` from the first container. Its own tokenizer/data cache directory
    (HOROVOD_TRAIN_CACHE, forwarded by every launcher) is filled by each host's local rank 0: finding it filled in
    the second container shows rank 1 ran there."""
    cache = f"/root/.cache/hvt-{name}"
    start = time.monotonic()
    proc = on_a(*launcher, "--", *LAUNCH_JOB, "--output_dir", f"/out/{name}", env={"HOROVOD_TRAIN_CACHE": cache})
    wall = time.monotonic() - start
    assert_ok(proc)
    results = read_results(out / name)
    assert results["world_size"] == 2 and results["controller"] == controller, results
    checksums = results["param_checksum_per_rank"]
    assert len(checksums) == 2 and checksums[0] == checksums[1], checksums
    listing = podman("exec", f"{PREFIX}-b", "ls", "-A", cache, timeout=60)
    assert listing.returncode == 0 and listing.stdout.strip(), f"rank 1 did not run in {PREFIX}-b: {listing.stderr}"
    print(f"\n[{name}: {wall:.1f} s, training loop {results['wall_time_s']:.1f} s]")
    return proc.stdout


def test_entrypoint_refuses_to_start_sshd_without_keys(image) -> None:
    proc = podman("run", "--rm", "-e", "HVT_SSHD=1", image, "true", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no /root/.ssh/authorized_keys"), proc.stderr


def test_image_is_tagged_with_the_package_version(image) -> None:
    proc = podman("run", "--rm", image, "python", "-c", "import horovod_train; print(horovod_train.__version__)",
                  timeout=120)  # fmt: skip
    assert_ok(proc)
    version = proc.stdout.strip().splitlines()[-1]
    assert "+" not in version, f"the image's package has no installed metadata: {version}"
    ids = {
        podman("image", "inspect", "--format", "{{.Id}}", tag, timeout=60).stdout
        for tag in (image, f"{TAG[:-3]}{version}-cpu")
    }
    assert len(ids) == 1 and "" not in ids, ids


def test_doctor_places_one_rank_in_each_container(containers) -> None:
    proc = on_a("launch/mpirun.sh", "-H", HOSTS, "--", "doctor", "--engine", "horovod")
    assert_ok(proc)
    assert rank_map(proc.stdout) == [(0, 0, "nodea", "cpu"), (1, 0, "nodeb", "cpu")], proc.stdout[-3000:]
    assert "(controller mpi)" in proc.stdout


def test_horovodrun_gloo_across_two_containers(containers) -> None:
    stdout = train("gloo", ["launch/horovodrun_multihost.sh", "-H", HOSTS, "--gloo"], containers, "gloo")
    assert effective_command(stdout, "horovodrun").startswith(f"+ horovodrun -np 2 -H {HOSTS} --gloo ")


def test_horovodrun_mpi_across_two_containers(containers) -> None:
    stdout = train("horovodrun-mpi", ["launch/horovodrun_multihost.sh", "-H", HOSTS, "--mpi"], containers, "mpi")
    command = effective_command(stdout, "horovodrun")
    assert command.startswith(f"+ horovodrun -np 2 -H {HOSTS} --mpi '--mpi-args=-gmca btl ^openib,ofi' ")


def test_mpirun_across_two_containers(containers) -> None:
    stdout = train("mpirun", ["launch/mpirun.sh", "-H", HOSTS], containers, "mpi")
    command = effective_command(stdout, "mpirun")
    assert command.startswith(f"+ mpirun --allow-run-as-root -np 2 -H {HOSTS} ")
    assert "-mca pml ob1 -mca btl '^openib' -gmca btl '^openib,ofi'" in command
