"""NCCL from torch's own pip wheel (nvidia-nccl-cu13 or -cu12), found and linked for Horovod's build.

Standard library only (gpucheck, which starts before a node's dependencies are installed, imports it too)."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path


def nccl_dirs(link_dir: Path) -> dict[str, str]:
    """HOROVOD_NCCL_INCLUDE/LIB from the pip package nvidia-nccl-cu13 (or -cu12), as installed.

    The wheel ships libnccl.so.2 only; CMake's find_library wants libnccl.so, so a link to it is made in
    ``link_dir`` and Horovod links NCCL shared (the same library torch loads). ``link_dir`` lands in the
    extension's RUNPATH, so a libnccl.so.2 link there finds NCCL even before torch has loaded it.
    """
    if os.environ.get("HOROVOD_NCCL_HOME") or os.environ.get("HOROVOD_NCCL_LIB"):
        return {}
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        try:
            files = importlib.metadata.distribution(dist).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        paths = [Path(str(f.locate())) for f in files]
        header = next((p for p in paths if p.name == "nccl.h"), None)
        lib = next((p for p in paths if p.name.startswith("libnccl.so")), None)
        if header and lib:
            link_dir.mkdir(parents=True, exist_ok=True)
            for name in ("libnccl.so", "libnccl.so.2"):
                link = link_dir / name
                link.unlink(missing_ok=True)
                link.symlink_to(lib.resolve())
            return {
                "HOROVOD_NCCL_INCLUDE": str(header.parent),
                "HOROVOD_NCCL_LIB": str(link_dir),
                "HOROVOD_NCCL_LINK": "SHARED",
            }
    return {}
