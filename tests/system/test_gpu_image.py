"""docker/Dockerfile's GPU variant built for real with Podman on this GPU-less machine, from the same local Debian
base as the CPU variant (no registry): `scripts/podman_build.sh build --variant gpu` installs PyPI's torch (a CUDA 13
build, its nvidia-* wheels with NCCL), the CUDA toolkit from PyPI at torch's CUDA (docker/cuda_toolkit.sh), Open MPI
from Debian, and Horovod 0.28.1 built with NCCL + MPI + Gloo. Then, in containers of the image without a GPU:
`horovodrun --check-build` lists NCCL, `nvcc --version` runs, `hvd.nccl_built()` is torch's NCCL version (true),
the demo trains 2 ranks on CPU under `horovodrun -np 2`, and the image carries the package's version as a tag
next to `gpu`.

Part of `make test` (`make test-gpu-image` runs this file alone). The CUDA Horovod wheel comes from
scripts/build_horovod_nccl.sh (`make nccl-build`, which tests/system/test_nccl_build.py checks), run first here
whatever the order, and is seeded into the build cache: compiling it inside the image (7 CUDA architectures) took
29 of a 40-minute cold build. Measured (docs/launch.md): 5.2 min with no GPU layers on a quiet 2-core machine
(11.6 under load 9-14), 17.6 s warm (layers are cached between runs on a machine); image 7 GB."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest
from support import builds
from support.docker import podman_env, podman_tools, remove_session_image
from support.jobs import BIN, assert_ok, read_results
from support.launch import LAUNCH_JOB, ensure_commands
from support.nccl import have_nvcc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600), pytest.mark.builds("gpu-image")]

IMAGE = builds.IMAGE  # this session's own name: another test run tags its own
TAG = f"{IMAGE}:gpu"
LISTED = ("[X] PyTorch", "[X] MPI", "[X] Gloo", "[X] NCCL")
RANK_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
ENV: dict[str, str] = {}


def in_image(*cmd: str, volumes: tuple[str, ...] = (), timeout: float = 300) -> subprocess.CompletedProcess:
    """``cmd`` in a new container of the GPU image (no GPU passed in), removed afterwards."""
    env_args = [a for name, value in RANK_ENV.items() for a in ("-e", f"{name}={value}")]
    mounts = [a for volume in volumes for a in ("--volume", volume)]
    return subprocess.run(["podman", "run", "--rm", *env_args, *mounts, TAG, *cmd], env=ENV, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.fail("building with podman needs root here: run `make test` as root")
    ensure_commands(podman_tools())
    ENV.update(podman_env(BIN / "python"), HVT_IMAGE=IMAGE)
    try:
        # `build --variant gpu --seed-horovod-wheel`, begun when the session started, after the NCCL build (where
        # there is no nvcc, the image compiles Horovod itself: about 30 min)
        if have_nvcc():
            assert_ok(builds.result("nccl"))
        proc = builds.result("gpu-image")
        assert proc is not None, "the GPU image's build could not start (see support/builds.py)"
        assert_ok(proc)
        size = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", TAG], env=ENV,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        print(f"\n[podman build --variant gpu: image {int(size.stdout) / 1e9:.2f} GB]")
        yield TAG
    finally:
        remove_session_image(IMAGE, "gpu", ENV)


def test_image_is_tagged_with_the_package_version(image) -> None:
    proc = in_image("python", "-c", "import horovod_train; print(horovod_train.__version__)")
    assert_ok(proc)
    version = proc.stdout.strip().splitlines()[-1]
    assert "+" not in version, f"the image's package has no installed metadata: {version}"
    ids = {}
    for tag in (image, f"{IMAGE}:{version}-gpu"):
        found = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", tag], env=ENV,
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert_ok(found)
        ids[tag] = found.stdout.strip()
    assert len(set(ids.values())) == 1, ids


def test_check_build_lists_nccl_mpi_and_gloo(image) -> None:
    proc = in_image("horovodrun", "--check-build")
    assert_ok(proc)
    missing = [item for item in LISTED if item not in proc.stdout]
    assert not missing, f"not listed: {missing}\n{proc.stdout}"


def test_nvcc_is_torchs_cuda(image) -> None:
    nvcc = in_image("nvcc", "--version")
    assert_ok(nvcc)
    torch_cuda = in_image("python", "-c", "import torch; print(torch.version.cuda, torch.cuda.is_available())")
    assert_ok(torch_cuda)
    cuda, gpu = torch_cuda.stdout.split()[-2:]
    assert f"release {cuda}," in nvcc.stdout, (cuda, nvcc.stdout)
    assert gpu == "False"  # what follows ran without a GPU


def test_horovod_torch_is_built_with_nccl(image) -> None:
    """hvd.nccl_built() is the NCCL version Horovod was built with (2.29.7 -> 22907; 0 without NCCL): torch's."""
    code = "import torch, horovod.torch as hvd; print(hvd.nccl_built(), *torch.cuda.nccl.version())"
    proc = in_image("python", "-c", code)
    assert_ok(proc)
    built, major, minor, patch = map(int, proc.stdout.split()[-4:])
    assert built == major * 10000 + minor * 100 + patch, proc.stdout


def test_demo_trains_two_ranks_on_cpu_under_horovodrun(image, tmp_path) -> None:
    args = ["--config", "configs/demo.yaml", *LAUNCH_JOB, "--max_steps", "4", "--output_dir", "/out/demo"]
    train = ["python", "-m", "horovod_train", "train", *args]
    proc = in_image("horovodrun", "-np", "2", "--gloo", *train, volumes=(f"{tmp_path}:/out",), timeout=900)
    assert_ok(proc)
    results = read_results(tmp_path / "demo")
    assert results["world_size"] == 2 and results["controller"] == "gloo", results
    checksums = results["param_checksum_per_rank"]
    assert len(checksums) == 2 and checksums[0] == checksums[1], checksums
