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


# One image per variant on the machine, the newest build a test session made: its layers are Podman's build cache
# for the next run here, which then rebuilds only what changed (the project's own layers, about 30 s), as a
# developer's own rebuilds do, where it built both variants from the Debian base (about 8 CPU-minutes). The disk keeps
# one copy of each variant's layers: `podman rmi localhost/horovod-train-test-cache:cpu ...:gpu` frees it.
CACHE_IMAGE = "localhost/horovod-train-test-cache"


def image_id(reference: str, env: dict[str, str]) -> str | None:
    found = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", reference], env=env,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    return (found.stdout.strip() or None) if found.returncode == 0 else None


def keep_as_build_cache(image: str, variant: str, env: dict[str, str]) -> None:
    """Tag the session's ``variant`` image as the machine's cache of it, and remove the one it replaces, with its
    layers that the new one does not share. That removal is refused while another tag names the old image (another
    run's session image): that run's own removal frees it."""
    new = image_id(f"{image}:{variant}", env)
    old = image_id(f"{CACHE_IMAGE}:{variant}", env)
    if new is None or new == old:  # a build that failed or was stopped leaves the cache as it was
        return
    subprocess.run(["podman", "tag", new, f"{CACHE_IMAGE}:{variant}"], env=env, capture_output=True, timeout=60)
    if old is not None:
        subprocess.run(["podman", "rmi", old], env=env, capture_output=True, timeout=300)


def remove_session_image(image: str, variant: str, env: dict[str, str]) -> None:
    """Remove the ``variant`` tags of ``image`` (a test session's own name: ``:cpu`` and ``:VERSION-cpu``) and nothing
    else, once the image is the machine's build cache (``keep_as_build_cache``): the CPU and the GPU image share the
    session's name, and each module's fixture removes its own tags alone (removing every tag of the name once
    untagged the GPU image its background build had just made). Untagged alone, each run's images and build steps
    stayed behind (about 10 GB a run) and the disk CI shares filled up ("No space left on device"); now a run leaves
    one image per variant, which the next one's build replaces."""
    keep_as_build_cache(image, variant, env)
    listed = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", image], env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    tags = [tag for tag in listed.stdout.split() if tag == f"{image}:{variant}" or tag.endswith(f"-{variant}")]
    if tags:
        subprocess.run(["podman", "rmi", *tags], env=env, capture_output=True, timeout=300)
