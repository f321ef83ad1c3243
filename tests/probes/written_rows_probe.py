"""Started under a real torchrun by tests/integration/test_engine_equivalence.py (HSDP's 2 x 2): `horovod-train train
ARGS`, each rank recording the spans it writes into its checkpoints' model files (state_io.write_pieces, the one
writer of a sharded checkpoint's rows, in the save's thread too) as RECORDS/rank<RANK>.json: {file: [[offset,
bytes, in_background], ...]} (in_background: written by another thread than the training's, as --save_async
writes), so the test sees which ranks wrote which rows, and how.

Usage: python written_rows_probe.py RECORDS ARGS...
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import torch

from horovod_train.cli.main import main
from horovod_train.engines import state_io


def recording_writes() -> dict[str, list[list[int]]]:
    spans: dict[str, list[list[int]]] = {}
    write = state_io.write_pieces

    def write_and_record(path: Path, pieces: list[tuple[int, torch.Tensor]]) -> None:
        background = int(threading.current_thread() is not threading.main_thread())
        spans.setdefault(str(path), []).extend([offset, t.numel() * t.element_size(), background]
                                               for offset, t in pieces)  # fmt: skip
        write(path, pieces)

    state_io.write_pieces = write_and_record
    return spans


if __name__ == "__main__":
    records, spans = Path(sys.argv[1]), recording_writes()
    status = main(["train", *sys.argv[2:]])
    records.mkdir(parents=True, exist_ok=True)
    (records / f"rank{os.environ['RANK']}.json").write_text(json.dumps(spans))
    sys.exit(status)
