"""Started under torchrun by tests/integration/test_ddp_dp.py: two DDP steps of a model with a parameter that gets no
gradient (a head this task never calls). Usage: python tests/probes/ddp_unused_probe.py true|false
(tests/probes/torchrun_workers_probe.py runs its main(True) after the refusal it checks)"""

from __future__ import annotations

import sys

import torch

from horovod_train.config.run_config import RunConfig, TrainingArguments
from horovod_train.engines import create_engine
from horovod_train.engines.ddp_options import DDPArguments


class TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.used, self.unused = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(self.body(x))


def main(find_unused: bool) -> None:
    options = DDPArguments(ddp_find_unused_parameters=find_unused)
    config = RunConfig(training=TrainingArguments(engine="ddp"), engine_options={"ddp": options})
    engine = create_engine(config)
    with engine.running():
        torch.manual_seed(0)
        model = TwoHeads()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = engine.wrap(model, optimizer)
        for step in range(2):
            model(torch.randn(8, 4)).sum().backward()
            engine.clip_and_step(model, optimizer, 1.0)
            optimizer.zero_grad()
            print(f"rank {engine.rank}: step {step + 1} done", flush=True)


if __name__ == "__main__":
    # A normal exit: the engine frees DDP's reducer before the process group, so the interpreter's teardown neither
    # hangs nor aborts ("terminate called without an active exception") once DDP found an idle parameter.
    main(sys.argv[1] == "true")
