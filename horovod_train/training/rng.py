"""Random number generators: one seed for a run, and each rank's generator states for exact resume.

States are plain lists and numbers, so every rank's can be gathered to rank 0 (``Engine.gather_objects``)
and saved in a checkpoint that loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def capture() -> dict[str, Any]:
    """This process's Python, NumPy, torch and CUDA generator states."""
    version, internal, gauss = random.getstate()
    _, key, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {"key": key.tolist(), "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached_gaussian)},
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():  # this rank's own device only: a resume may see fewer GPUs
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device()).tolist()
    return state


def restore(state: dict[str, Any]) -> None:
    py, nps = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    np.random.set_state(("MT19937", np.array(nps["key"], dtype=np.uint32), nps["pos"], nps["has_gauss"], nps["cached"]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        restore_cuda(state["cuda"])


def restore_cuda(saved: list[int] | list[list[int]]) -> None:
    """Into this rank's device (never an index this node may not have). Checkpoints written before this
    saved every visible device's state: the entry of the device this rank now uses, if it was saved."""
    device = torch.cuda.current_device()
    if saved and isinstance(saved[0], list):
        if device >= len(saved):
            return
        saved = saved[device]
    torch.cuda.set_rng_state(torch.tensor(saved, dtype=torch.uint8), device)
