"""Run a launcher so that a rank's one-line usage error is the last thing it prints (the launch/ scripts' hvt_run).

A rank that meets bad input prints `error: PROBLEM; fix: FIX` and exits 2 (horovod_train/common/errors.py); then the
launcher reports the failed rank in its own words, after that line: horovodrun a Python traceback, mpirun a box,
srun a line. Neither can be turned off (mpirun's -q would hide its reports of crashes too). So the launcher's
stderr passes through here: such an error line is held back and printed last, without the launcher's rank tag, and
the exit status is 2 (horovodrun's own would be 1). Each line a rank printed is printed (rank 0 alone prints a
job's bad input): none is dropped as a repeat. Everything else passes through as it comes; stdout is the
launcher's own.

The caller's signals reach the launcher as if this were it (the scripts used to exec it): SIGTERM, SIGHUP, SIGUSR1
and SIGUSR2 are passed on (k8s/pod.sh --forward USR1 -> mpirun -> the ranks). SIGINT is not: Ctrl-C reaches the
launcher from the terminal itself (it is in the same process group), and a second one makes mpirun quit at once.

Standard library only. Usage: python3 launch/error_last.py LAUNCHER [ARGS...]
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from typing import BinaryIO

USAGE_EXIT_CODE = 2
# `error: ...; fix: ...`, as a rank prints it, behind the tag of horovodrun ([0]<stderr>:) or mpirun's
# --tag-output ([1,0]<stderr>:) if any.
ERROR_LINE = re.compile(rb"^(?:\[[0-9,]+\]<stderr>:)?(error: .*; fix: .*)$")
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# After the launcher exits, how long its stderr may stay open (a rank's orphaned child still holding it).
DRAIN_S = 10.0


def relay(stream: BinaryIO, out: BinaryIO, held: list[bytes]) -> None:
    """Copy ``stream`` to ``out`` line by line, keeping the error lines in ``held`` instead."""
    for line in stream:
        match = ERROR_LINE.match(line.rstrip(b"\r\n"))
        if match is None:
            out.write(line)
            out.flush()
        else:
            held.append(match[1])


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("error: no launcher given; fix: python3 launch/error_last.py LAUNCHER [ARGS...]\n")
        return USAGE_EXIT_CODE
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, lambda signum, frame: None)  # a handler: the launcher gets the default again
    started: list[subprocess.Popen] = []
    early: list[int] = []  # signals that came before the launcher started: passed on once it has

    def forward(signum: int, frame: object) -> None:
        if started:
            started[0].send_signal(signum)
        else:
            early.append(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    launcher = subprocess.Popen(argv, stderr=subprocess.PIPE)
    started.append(launcher)
    for signum in early:
        launcher.send_signal(signum)
    held: list[bytes] = []
    reader = threading.Thread(target=relay, args=(launcher.stderr, sys.stderr.buffer, held), daemon=True)
    reader.start()
    status = launcher.wait()
    reader.join(DRAIN_S)
    for line in list(held):
        sys.stderr.buffer.write(line + b"\n")
    sys.stderr.flush()
    if held and status != 0:
        return USAGE_EXIT_CODE
    return status if status >= 0 else 128 - status  # killed by a signal: as a shell reports it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
