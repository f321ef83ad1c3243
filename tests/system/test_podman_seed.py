"""scripts/podman_build.sh seed (the step of `build --seed-horovod-wheel`): the Horovod wheel goes into the image
build's cache mount, which lies in a world-writable directory, only when it matches the digest recorded when
scripts/build_horovod.sh built it; whatever another user left there is replaced.
tests/system/test_docker_build.py builds the image with the seeded wheel."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.jobs import REPO

pytestmark = pytest.mark.skipif(
    "bookworm" not in Path("/etc/os-release").read_text(), reason="seeding runs only on Debian 12 hosts"
)


def wheel_key() -> str:
    """The cache key scripts/build_horovod.sh (and podman_build.sh) use for this Python and torch."""
    import torch

    torch_version = torch.__version__.replace("+", "_")
    return f"horovod-0.28.1-torch{torch_version}-cuda{torch.version.cuda or 'cpu'}-cp{sys.version_info[0]}" \
           f"{sys.version_info[1]}"  # fmt: skip


def seed(tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOROVOD_WHEEL_CACHE": str(tmp_path / "wheels"), "TMPDIR": str(tmp_path / "tmp"),
           "HVT_PYTHON": sys.executable}  # fmt: skip
    return subprocess.run(["bash", "scripts/podman_build.sh", "seed"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def built_wheel(tmp_path: Path) -> Path:
    """A wheel as build_horovod.sh leaves it: the file and the SHA256SUMS recorded when it was built."""
    directory = tmp_path / "wheels" / wheel_key()
    directory.mkdir(parents=True)
    wheel = directory / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"the wheel make setup built")
    (directory / "SHA256SUMS").write_text(f"{hashlib.sha256(wheel.read_bytes()).hexdigest()}  {wheel.name}\n")
    return wheel


def test_the_seeded_cache_holds_the_verified_wheel_only(tmp_path):
    wheel = built_wheel(tmp_path)
    planted = tmp_path / "tmp" / "buildah-cache" / "root/.cache/horovod-train/wheels" / wheel_key()
    planted.mkdir(parents=True)
    (planted / wheel.name).write_bytes(b"a wheel another user put here")  # same name: it used to be kept
    (planted / "horovod-0.28.1-evil.whl").write_bytes(b"another one")
    planted.chmod(0o777)
    proc = seed(tmp_path)
    assert proc.returncode == 0, proc.stderr
    for cache in ("buildah-cache", f"buildah-cache-{os.getuid()}"):
        seeded = tmp_path / "tmp" / cache / "root/.cache/horovod-train/wheels" / wheel_key()
        assert sorted(p.name for p in seeded.iterdir()) == ["SHA256SUMS", wheel.name]
        assert (seeded / wheel.name).read_bytes() == wheel.read_bytes()
        assert not seeded.stat().st_mode & 0o022


def test_a_wheel_that_does_not_match_its_recorded_digest_is_refused(tmp_path):
    wheel = built_wheel(tmp_path)
    wheel.write_bytes(b"changed after it was built")
    proc = seed(tmp_path)
    assert proc.returncode == 2 and "does not match the digest recorded" in proc.stderr, proc.stderr
    assert not (tmp_path / "tmp" / "buildah-cache").exists()
