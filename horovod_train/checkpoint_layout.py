"""A checkpoint's names in a run directory, and what needs only the paths: no torch, so that rank 0 can judge
``--output_dir`` and ``--resume_from_checkpoint`` before the job loads it (``run_directory``). What a checkpoint
holds and how it is written and read is ``checkpoint``'s."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from horovod_train.errors import UsageError

PREFIX = "checkpoint-"
MANIFEST = "manifest.json"
NAME = re.compile(rf"{PREFIX}(\d+)")
STALE = re.compile(rf"\.{PREFIX}\d+\..*\.tmp|\.{PREFIX}\d+\.previous")
AUTO, LATEST = "auto", "latest"


def clean_stale(output_dir: Path) -> None:
    """Remove what crashed writes left: temporary checkpoints, and replaced ones whose successor is in
    place (a replaced one whose successor never arrived is put back)."""
    if not output_dir.is_dir():
        return
    for path in output_dir.iterdir():
        if not STALE.fullmatch(path.name):
            continue
        original = output_dir / path.name[1 : -len(".previous")] if path.name.endswith(".previous") else None
        if original is not None and not original.exists():
            os.rename(path, original)
        else:
            shutil.rmtree(path, ignore_errors=True)


def named_checkpoint(spec: str) -> Path:
    """The directory ``--resume_from_checkpoint`` names (not auto or latest), which must exist."""
    path = Path(spec)
    if not path.is_dir():
        raise UsageError(
            f"--resume_from_checkpoint {spec} does not exist", "pass a checkpoint-<step> directory, 'latest' or 'auto'"
        )
    return path
