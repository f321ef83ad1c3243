"""Checkpoints that survive crashes and load without unpickling arbitrary objects.

A checkpoint is a directory ``checkpoint-<step>`` holding the model (safetensors), the optimizer and
the RNG states (``torch.save``, read back with ``weights_only=True``), a
``trainer_state.json`` (global step, epoch, position inside the epoch, run configuration) and a
``manifest.json`` with the SHA-256 of every file. It is written to a temporary directory, every file
fsynced, then renamed into place, so a crash mid-write leaves the previous checkpoint valid; a
truncated or altered file fails the manifest check and is reported, never half-loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from horovod_train.errors import UsageError
from horovod_train.files import atomic_directory
from horovod_train.position import TrainingPosition

PREFIX = "checkpoint-"
MODEL_FILE = "model.safetensors"
STATE_FILE = "training_state.pt"
TRAINER_FILE = "trainer_state.json"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Compatibility:
    """What a checkpoint must agree with to be loaded into a run."""

    model_name_or_path: str
    num_labels: int
    vocab_size: int
    architecture: str

    def check(self, saved: dict[str, Any], path: Path) -> None:
        for name in (f.name for f in fields(self)):
            if saved.get(name) != getattr(self, name):
                raise UsageError(
                    f"checkpoint {path} was saved with {name}={saved.get(name)!r} but this run has "
                    f"{name}={getattr(self, name)!r}",
                    "resume with the same model and labels, or start a new --output_dir",
                )


def rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "pos": np_state[2],
                  "has_gauss": np_state[3], "cached_gaussian": np_state[4]},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"].tolist()), py["gauss"]))
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["key"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        with path.open("rb") as f:
            os.fsync(f.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    output_dir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    position: TrainingPosition,
    compatibility: Compatibility,
    config: dict[str, Any],
    keep: int | None,
    extra_state: dict[str, Any] | None = None,
) -> Path:
    """Write ``checkpoint-<step>`` atomically (call on rank 0 only) and prune to the last ``keep``."""
    target = output_dir / f"{PREFIX}{position.global_step}"
    if target.exists():
        shutil.rmtree(target)
    with atomic_directory(target) as tmp:
        tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(tensors, tmp / MODEL_FILE)
        torch.save({"optimizer": optimizer.state_dict(), "rng": rng_state(), **(extra_state or {})}, tmp / STATE_FILE)
        trainer_state = {**position.to_dict(), "compatibility": asdict(compatibility), "config": config}
        (tmp / TRAINER_FILE).write_text(json.dumps(trainer_state, indent=2, sort_keys=True) + "\n")
        manifest = {name: _sha256(tmp / name) for name in (MODEL_FILE, STATE_FILE, TRAINER_FILE)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        _fsync_tree(tmp)
    if keep:
        for old in list_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return target


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints (renamed into place), oldest first."""
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.iterdir() if p.is_dir() and re.fullmatch(rf"{PREFIX}\d+", p.name)]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def resolve_checkpoint(spec: str, output_dir: Path) -> Path:
    if spec == "latest":
        found = list_checkpoints(output_dir)
        if not found:
            raise UsageError(f"--resume_from_checkpoint latest: no checkpoint in {output_dir}",
                             "run with --save_steps first, or pass a checkpoint directory")
        return found[-1]
    path = Path(spec)
    if not path.is_dir():
        raise UsageError(f"--resume_from_checkpoint {spec} does not exist",
                         "pass a checkpoint-<step> directory or 'latest'")
    return path


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Check every file against the manifest; return the trainer state. Nothing is loaded on failure."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        raise UsageError(f"checkpoint {path} has no readable {MANIFEST} (incomplete or not a checkpoint)",
                         "resume from an earlier checkpoint") from None
    for name, digest in manifest.items():
        file = path / name
        if not file.is_file() or _sha256(file) != digest:
            raise UsageError(f"checkpoint {path} is corrupted ({name} does not match its checksum)",
                             "resume from an earlier checkpoint")
    return json.loads((path / TRAINER_FILE).read_text())


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """(model tensors, training state, trainer state) of a verified checkpoint."""
    trainer_state = verify_checkpoint(path)
    tensors = load_file(path / MODEL_FILE)
    training_state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    return tensors, training_state, trainer_state
