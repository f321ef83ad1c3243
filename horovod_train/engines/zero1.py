"""ZeRO stage 1: DDP's replication (the same launchers, process group, gradient buckets and ``--ddp_*`` options)
with the optimizer's state sharded over the ranks by torch's ``ZeroRedundancyOptimizer`` (parallelize.Replicate's
``shard_optimizer``).

Every rank still holds the whole model and, after DDP's all-reduce, the whole averaged gradient (so clipping is
DDP's); each rank keeps AdamW's two moments for its own share of the parameters only, steps that share and
broadcasts it to the others. Per parameter that is 4 (weights) + 4 (gradient) + 8/W (AdamW) bytes per rank
instead of DDP's 16 (memory.OptimizerSharded). A checkpoint's optimizer state is sharded
(checkpoint_io.OptimizerShards): each rank writes the state of the parameters it steps and, resuming, reads those
it steps now, at any world size; another engine reads it whole.
"""

from __future__ import annotations

import functools
from typing import ClassVar

from horovod_train.engines.checkpoint_io import OptimizerShards, WholeState
from horovod_train.engines.parallelize import Replicate
from horovod_train.engines.process_group import ProcessGroupEngine


class Zero1Engine(ProcessGroupEngine):
    name = "zero1"
    parallelize = functools.partial(Replicate, shard_optimizer=True)
    checkpoint_io: ClassVar[type[WholeState]] = OptimizerShards
