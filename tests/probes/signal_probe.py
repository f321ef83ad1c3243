"""A stand-in process for tests/system/test_launch_slurm_signal.py: records SIGUSR1 in a file (MARKER; catching it,
as a training rank does) and SIGTERM in another (MARKER.done), may start one child with more environment variables (a
launcher's worker), then waits. WORD is one more word of its command line (and its child's), which must not decide
whether it is signalled. SIGTERM is the test's barrier: Python runs the handlers of pending signals in the order of
their numbers, so a SIGUSR1 sent before it is recorded first.

Usage: python signal_probe.py MARKER WORD [VAR=VALUE ...]   (VAR=VALUE: the child's extra environment)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(marker: str, word: str, child_env: list[str]) -> None:
    signal.signal(signal.SIGUSR1, lambda *_: Path(marker).touch())
    signal.signal(signal.SIGTERM, lambda *_: Path(f"{marker}.done").touch())
    if child_env:
        env = {**os.environ, **dict(pair.split("=", 1) for pair in child_env)}
        probe = os.environ.get("HVT_PROBE", __file__)
        subprocess.Popen([sys.executable, probe, f"{marker}.child", word], env=env)
    Path(f"{marker}.ready").write_text(str(os.getpid()))
    time.sleep(120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
