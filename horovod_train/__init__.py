"""horovod-train: one trainer, many data-parallel engines (Horovod, DDP, DataParallel)."""

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def _version() -> str:
    """The installed distribution's version (pyproject.toml's, the one place it is written); in a source checkout
    that is not installed (PYTHONPATH=., the image's early build steps), the checkout's pyproject.toml says it."""
    try:
        return version("horovod-train")
    except PackageNotFoundError:
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        found = re.search(r'(?m)^version = "([^"]+)"', pyproject.read_text()) if pyproject.is_file() else None
        return f"{found[1]}+source" if found else "0+unknown"


__version__ = _version()
