"""The Dockerfile and entry point as the static and build tests read them."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from support.jobs import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"
PODMAN_BUILD = REPO / "scripts" / "podman_build.sh"

# build_horovod.sh checks `horovodrun --check-build` itself (build-horovod); the image runs check_horovod_build.sh too.
SHARED_SCRIPTS = ["scripts/install_mpi.sh", "scripts/build_horovod.sh"]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def podman_tools() -> dict[str, str]:
    """The commands scripts/podman_build.sh and the image tests drive, each with its Debian package."""
    return {
        "podman": "podman",
        "buildah": "buildah",
        "mmdebstrap": "mmdebstrap",
        "runc": "runc",
        "slirp4netns": "slirp4netns",
        "newuidmap": "uidmap",
        "iptables": "iptables",
        "ssh-keygen": "openssh-client",
    }


def podman_env(python: Path) -> dict[str, str]:
    """This environment plus CONTAINERS_CONF, the file scripts/podman_build.sh writes (runc, accepted ulimits), and
    HVT_PYTHON (whose torch version picks the torch wheel and the cached Horovod wheels)."""
    env = {**os.environ, "HVT_PYTHON": str(python)}
    conf = subprocess.run([str(PODMAN_BUILD), "conf"], env=env, capture_output=True, text=True, timeout=60)
    assert conf.returncode == 0, conf.stdout + conf.stderr
    return {**env, "CONTAINERS_CONF": conf.stdout.strip().splitlines()[-1]}


def remove_session_image(image: str, variant: str, env: dict[str, str]) -> None:
    """Remove the ``variant`` tags of ``image`` (a test session's own name: ``:cpu`` and ``:VERSION-cpu``) and nothing
    else: the CPU and the GPU image share the session's name, and each module's fixture removes its own tags alone
    (removing every tag of the name once untagged the GPU image its background build had just made). `podman rmi`
    of the last tag removes the image and the build steps' cached images that no other image uses: untagged alone,
    each run left about 10 GB of layers behind, and the disk CI shares filled up ("No space left on device").
    The next run on the machine builds again (base image and pip's cache mount kept: a few minutes)."""
    listed = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", image], env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    tags = [tag for tag in listed.stdout.split() if tag == f"{image}:{variant}" or tag.endswith(f"-{variant}")]
    if tags:
        subprocess.run(["podman", "rmi", *tags], env=env, capture_output=True, timeout=300)
