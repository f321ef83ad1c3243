"""ZeRO stage 1: DDP (the same launchers, process group, gradient buckets and ``--ddp_*`` options), with the
optimizer's state sharded over the ranks by torch's ``ZeroRedundancyOptimizer``.

Every rank still holds the whole model and, after DDP's all-reduce, the whole averaged gradient (so clipping is
DDP's); each rank keeps AdamW's two moments for its own share of the parameters only, steps that share and
broadcasts it to the others. Per parameter that is 4 (weights) + 4 (gradient) + 8/W (AdamW) bytes per rank
instead of DDP's 16. A checkpoint's optimizer state is sharded (state_io): each rank writes the state of the
parameters it steps and, resuming, reads those it steps now, at any world size; another engine reads it whole.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.optim import Optimizer

from horovod_train.engines import state_io
from horovod_train.engines.ddp import DDPEngine
from horovod_train.engines.state_io import BackgroundWrite


class Zero1Engine(DDPEngine):
    name = "zero1"

    def wrap(self, model: nn.Module, optimizer: Optimizer) -> tuple[nn.Module, Optimizer]:
        wrapped, _ = super().wrap(model, optimizer)
        return wrapped, sharded_like(optimizer)

    sharded_state = True

    def save_state_shards(
        self, model: nn.Module, optimizer: Optimizer, directory: Path, background: BackgroundWrite | None = None
    ) -> dict[str, str]:
        # The model is whole on every rank: rank 0 writes it. The optimizer: each rank the parameters it steps.
        indices = state_io.parameter_indices(optimizer)
        local = {indices[id(p)]: entry for p, entry in optimizer.optim.state.items()}
        state_io.on_every_rank(self.gather_objects, lambda: state_io.save_optimizer_shards(
            local, directory / state_io.OPTIMIZER_DIR, background))  # fmt: skip
        return state_io.written_digests(directory, self.rank, background)

    def load_optimizer_state(self, model: nn.Module, optimizer: Optimizer, state: dict[str, Any]) -> None:
        state = state_io.optimizer_source(state)
        if state_io.SHARDED in state:  # each rank reads the state of the parameters it steps
            params = [p for group in optimizer.param_groups for p in group["params"]]
            mine = {id(p) for group in optimizer.optim.param_groups for p in group["params"]}
            loaded = state_io.load_optimizer_shards(Path(state[state_io.SHARDED]), params,
                                                    wanted=lambda index: id(params[index]) in mine)  # fmt: skip
            state = {"state": loaded, "param_groups": state["param_groups"]}
        super().load_optimizer_state(model, optimizer, state)

    def full_optimizer_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any] | None:
        optimizer.consolidate_state_dict(to=0)  # collective: every rank sends its share to rank 0
        return optimizer.state_dict() if self.is_main else None

    @classmethod
    def state_bytes_per_rank(cls, params: int, trainable: int, world_size: int) -> float:
        return 4 * params + 4 * trainable + 8 * trainable / world_size


def sharded_like(optimizer: Optimizer) -> ZeroRedundancyOptimizer:
    """A ZeroRedundancyOptimizer of ``optimizer``'s class, groups and settings (it has no state yet): the groups'
    parameters are numbered as ``optimizer``'s, so its consolidated state dict is the one ``optimizer`` would have."""
    accepted = inspect.signature(type(optimizer)).parameters
    settings = {k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params"}
    groups = [dict(group) for group in optimizer.param_groups]
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **settings)
