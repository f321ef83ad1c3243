"""Started under a real launcher by tests/integration/test_broadcast.py: rank 0 broadcasts a UsageError, then a nested
payload with one large tensor (GIB GiB, 0 for none) and small ones of several dtypes; every rank checks
what it received and writes OUT/rank-<rank>.json (its checks, the broadcast's seconds, its peak RSS).

Usage: python tests/probes/broadcast_probe.py ENGINE GIB OUT
"""

from __future__ import annotations

import hashlib
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from horovod_train.common.errors import UsageError
from horovod_train.config.run_config import RunConfig, TrainingArguments
from horovod_train.engines import create_engine


def small_tensors() -> dict[str, torch.Tensor]:
    """The same on every rank, so receivers can check exact equality."""
    grid = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "bfloat16": torch.linspace(-3, 3, 7, dtype=torch.bfloat16),
        "int64": torch.tensor([-(2**62), -1, 0, 2**62]),
        "bool": torch.tensor([[True, False], [False, True]]),
        "transposed": grid.t(),  # a non-contiguous view
        "column": grid[:, 1],  # a non-contiguous view with an offset
        "scalar": torch.tensor(3.5, dtype=torch.float64),  # 0-d
        "empty": torch.empty(0, 3, dtype=torch.int16),
        "half": torch.full((3,), 0.1, dtype=torch.float16),
    }


def large_tensor(gib: float) -> torch.Tensor:
    """Distinct 4-byte words (a misplaced chunk shows) made in one cheap pass, no second copy."""
    return torch.arange(int(gib * 2**30) // 4, dtype=torch.int32)


def sha256(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.numpy()).hexdigest()


STATE = {"step": 7, "name": "bert-large", "nested": [1, (2, "three")]}


def payload(gib: float) -> dict[str, Any]:
    big = large_tensor(gib)
    shared = torch.ones(2, 2)
    return {
        "model": {"big": big, "small": small_tensors()},
        "digest": sha256(big),  # rank 0's: each receiver hashes what it got
        "shared": [shared, shared],  # one tensor twice
        "state": {**STATE, "rng": np.arange(5, dtype=np.uint32)},
        "error": UsageError("a problem", "a fix"),
    }


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def check(received: dict[str, Any]) -> dict[str, bool]:
    small, expected = received["model"]["small"], small_tensors()
    state, error = dict(received["state"]), received["error"]
    rng = state.pop("rng")
    return {
        "big": sha256(received["model"]["big"]) == received["digest"],
        "small": small.keys() == expected.keys() and all(same(t, expected[k]) for k, t in small.items()),
        "shared": all(same(t, torch.ones(2, 2)) for t in received["shared"]),
        "state": state == STATE,
        "rng": rng.dtype == np.uint32 and rng.tolist() == [0, 1, 2, 3, 4],
        "error": type(error) is UsageError and (error.problem, error.fix) == ("a problem", "a fix"),
    }


def probe(engine, gib: float) -> dict[str, Any]:
    error = engine.broadcast_object(UsageError("no checkpoint", "start fresh") if engine.is_main else None)
    report: dict[str, Any] = {
        "rank": engine.rank,
        "world_size": engine.world_size,
        "usage_error": [type(error).__name__, error.problem, error.fix],
    }
    sent = payload(gib) if engine.is_main else None
    engine.barrier()  # time the broadcast alone, not rank 0 making the payload
    start = time.perf_counter()
    received = engine.broadcast_object(sent)
    report["seconds"] = time.perf_counter() - start
    report["big_bytes"] = received["model"]["big"].nbytes
    report["checks"] = check(received)
    report["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return report


def main(engine_name: str, gib: float, out: Path) -> None:
    engine = create_engine(RunConfig(training=TrainingArguments(engine=engine_name)))
    with engine.running():
        report = probe(engine, gib)
        engine.barrier()
    (out / f"rank-{report['rank']}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), Path(sys.argv[3]))
