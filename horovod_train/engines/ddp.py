"""PyTorch DistributedDataParallel: the process group's engine (process_group.py) with the whole model replicated
on every rank of a 1-D mesh of replicas (parallelize.Replicate), its checkpoint written whole by rank 0
(checkpoint_io.WholeState), every rank holding the whole training state (memory.Replicated)."""

from __future__ import annotations

from typing import ClassVar

from horovod_train.engines.checkpoint_io import WholeState
from horovod_train.engines.parallelize import Replicate
from horovod_train.engines.process_group import ProcessGroupEngine


class DDPEngine(ProcessGroupEngine):
    name = "ddp"
    parallelize = Replicate
    checkpoint_io: ClassVar[type[WholeState]] = WholeState
