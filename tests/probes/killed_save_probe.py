"""Started under a real torchrun by tests/integration/test_checkpoint_resharding.py: `horovod-train train ARGS`, where
rank 1 is SIGKILLed in the middle of an asynchronous save (--save_async) of checkpoint-STEP: its background write
has written its files, the checkpoint is not complete (no manifest, not renamed), and training has gone on. The
kill comes from inside the write, at that point every time: no race with a watcher.

Usage: python killed_save_probe.py STEP ARGS...
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from horovod_train.cli.main import main
from horovod_train.engines import state_io


def kill_rank_1_in_the_write_of(step: int) -> None:
    start = state_io.BackgroundWrite.start

    def start_then_die(self: state_io.BackgroundWrite, directory: Path, rank: int, then):  # noqa: ANN001, ANN202
        if rank == 1 and directory.name.startswith(f".checkpoint-{step}."):
            self.add(lambda: os.kill(os.getpid(), signal.SIGKILL))  # after this rank's writes, before the manifest
        return start(self, directory, rank, then)

    state_io.BackgroundWrite.start = start_then_die


if __name__ == "__main__":
    kill_rank_1_in_the_write_of(int(sys.argv[1]))
    sys.exit(main(["train", *sys.argv[2:]]))
