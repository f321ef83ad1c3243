"""Started under a real launcher by tests/integration/test_stopping.py: every rank watches SIGUSR1, rank 1 alone
receives it, the ranks agree on it through the engine's real all-reduce (as the training loop's stop does), close
their watch, and then every rank gets SIGUSR1 once more: the late one a batch shell sends to each node. A rank
that stopped on another rank's signal must survive it. Each rank writes OUT/rank-<rank>.json after that signal.

Usage: python stop_agreement_probe.py ENGINE OUT
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from horovod_train.config.run_config import RunConfig, TrainingArguments
from horovod_train.engines import create_engine
from horovod_train.training.stopping import StopSignals


def main(engine_name: str, out: Path) -> None:
    engine = create_engine(RunConfig(training=TrainingArguments(engine=engine_name)))
    with engine.running():
        watch = StopSignals([signal.SIGUSR1])
        if engine.rank == 1:
            os.kill(os.getpid(), signal.SIGUSR1)
        polls, agreed = 0, None
        while agreed is None and polls < 3:  # one step behind: the second poll reads the first's sum
            agreed, polls = watch.poll(engine), polls + 1
        engine.barrier()
        watch.close()
        os.kill(os.getpid(), signal.SIGUSR1)  # the late one
        report = {"rank": engine.rank, "received": watch.received, "agreed": agreed, "polls": polls}
        (out / f"rank-{engine.rank}.json").write_text(json.dumps(report))
        engine.barrier()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
