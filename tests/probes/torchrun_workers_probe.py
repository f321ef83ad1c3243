"""Started under torchrun (two workers) by tests/integration/test_ddp_dp.py: three checks of one launch. `train
--engine single ARGS` and `train --engine horovod ARGS` (the command line's main, in this process) refuse a real
torchrun's workers (horovod's ranks would each start a Horovod job of one: issue 56); then the same workers train
ddp_unused_probe.py's two DDP steps of a model with an idle parameter, with find_unused_parameters.
Usage: python tests/probes/torchrun_workers_probe.py ARGS"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_unused_probe import main  # noqa: E402 (the probes are scripts, not a package on the path)

from horovod_train.cli import main as cli  # noqa: E402

if __name__ == "__main__":
    for engine in ("single", "horovod"):
        try:
            code = cli.main(["train", "--engine", engine, *sys.argv[1:]])
        except SystemExit as exited:
            code = exited.code
        print(f"rank {os.environ['RANK']}: --engine {engine} exited {code}", flush=True)
    main(True)  # a normal exit: the reducer freed before the process group (DDPEngine.shutdown)
