"""The environment Horovod is built for: the running interpreter and the torch it imports."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from horovod_train.common.errors import UsageError


@dataclass(frozen=True)
class Target:
    python: str  # the interpreter whose environment gets Horovod
    prefix: Path  # sys.prefix: its bin/ holds horovodrun (and pip's cmake) once installed
    torch_version: str  # torch.__version__, e.g. 2.13.0+cpu
    torch_cuda: str | None  # torch.version.cuda, None for a CPU build
    pytag: str  # cp311

    @property
    def bin_dir(self) -> Path:
        return Path(self.python).parent


def torch_missing_error() -> UsageError:
    return UsageError(
        f"torch is not importable in {sys.executable} (Horovod is compiled against this environment's torch)",
        f"install torch into this environment first ({sys.executable} -m pip install torch), then rerun",
    )


def running_target() -> Target:
    """The interpreter running this command; torch imported here, as the Horovod extension will import it."""
    if importlib.util.find_spec("torch") is None:
        raise torch_missing_error()
    import torch

    return Target(
        python=sys.executable,
        prefix=Path(sys.prefix),
        torch_version=torch.__version__,
        torch_cuda=torch.version.cuda or None,
        pytag=f"cp{sys.version_info[0]}{sys.version_info[1]}",
    )
