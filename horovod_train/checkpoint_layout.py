"""A checkpoint's names in a run directory, and what needs only the paths: no torch, so that rank 0 can judge
``--output_dir`` and ``--resume_from_checkpoint`` before the job loads it (``run_directory``). What a checkpoint
holds and how it is written and read is ``checkpoint``'s."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path, PurePosixPath

from horovod_train.errors import UsageError

PREFIX = "checkpoint-"
MANIFEST = "manifest.json"
TRAINER_FILE = "trainer_state.json"  # transformers' name: a checkpoint's, and a finished run's at its top level
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


def saved_state(checkpoint: Path) -> dict:
    """A checkpoint's trainer state as written, unverified ({} where unreadable): enough to order checkpoints."""
    try:
        state = json.loads((checkpoint / TRAINER_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def unlisted(checkpoint: Path) -> list[str] | None:
    """What a checkpoint folder holds besides the files its manifest lists (a run's directory made inside it, a
    user's file), by relative path, a folder once, sorted; None where it has no readable manifest (not a
    checkpoint). Only a checkpoint with nothing unlisted is this project's to delete whole: its name and its
    manifest say who made the folder, not who put things in it since. Nothing else is allowed inside: a checkpoint
    is written whole in a temporary folder and renamed into place, so it holds no temporaries of its own."""
    try:
        manifest = json.loads((checkpoint / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    files = {*map(str, manifest), MANIFEST}
    folders = {parent.as_posix() for name in files for parent in PurePosixPath(name).parents} - {"."}
    found: list[str] = []

    def inside(path: str | os.PathLike) -> str:
        return Path(path).relative_to(checkpoint).as_posix()

    def unreadable(error: OSError) -> None:  # a folder whose content is unknown counts as unlisted
        found.append(inside(error.filename))

    for root, dirs, names in os.walk(checkpoint, onerror=unreadable):
        for name in list(dirs):
            if inside(Path(root, name)) not in folders or Path(root, name).is_symlink():
                found.append(inside(Path(root, name)))
                dirs.remove(name)  # reported once, not descended
        found += [inside(Path(root, name)) for name in names if inside(Path(root, name)) not in files]
    return sorted(found)


def named_checkpoint(spec: str) -> Path:
    """The directory ``--resume_from_checkpoint`` names (not auto or latest), which must exist."""
    path = Path(spec)
    if not path.is_dir():
        raise UsageError(
            f"--resume_from_checkpoint {spec} does not exist", "pass a checkpoint-<step> directory, 'latest' or 'auto'"
        )
    return path
