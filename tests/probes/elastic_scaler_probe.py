"""Started under horovodrun -np 2 by tests/integration/test_amp.py: elastic Horovod's TorchState with fp16's GradScaler.

Rank 0's scaler has backed off (scale 1024) and rank 1's is fresh (65536), as after a worker joined a job.
Syncing the state must give rank 1 rank 0's scaler; a commit followed by a failed step and a restore must
give every rank the committed scale back. (A CPU GradScaler: the state handling is the CUDA one's.)
Each rank writes OUT/rank-<rank>.json.

Usage: python tests/probes/elastic_scaler_probe.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import horovod.torch as hvd
import torch

from horovod_train.engines.horovod import elastic
from horovod_train.training.position import TrainingPosition


def scaler_state(scaler: torch.amp.GradScaler) -> dict[str, float]:
    state = scaler.state_dict()
    return {"scale": state["scale"], "growth_tracker": state["_growth_tracker"]}


def main(out: Path) -> None:
    hvd.init()
    torch.manual_seed(hvd.rank())
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    if hvd.rank() == 0:  # the survivor, after overflowing steps
        scaler.load_state_dict({**scaler.state_dict(), "scale": 1024.0, "_growth_tracker": 7})
    report = {"before_sync": scaler_state(scaler)}
    state = elastic.torch_state(hvd, model, optimizer, None, TrainingPosition(), scaler)
    state.sync()  # what hvd.elastic.run does when the loop (re)starts in a new world
    report["after_sync"] = scaler_state(scaler)
    state.save()  # a commit
    scaler.load_state_dict({**scaler.state_dict(), "scale": 8.0, "_growth_tracker": 0})  # a step that failed
    state.restore()  # what hvd.elastic.run does after a HorovodInternalError
    report["after_restore"] = scaler_state(scaler)
    (out / f"rank-{hvd.rank()}.json").write_text(json.dumps(report))
    hvd.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
