"""Lines to the console that stay whole under any launcher.

``print`` writes a text and its newline in two calls, and unbuffered (PYTHONUNBUFFERED, as launchers
often set it) each becomes a write of its own: mpirun's --tag-output then tags the lone newline too,
and the next rank tag lands at the end of the line. One write per line keeps tags at line starts.
"""

from __future__ import annotations

import sys
from typing import TextIO


def write_line(message: str, file: TextIO | None = None) -> None:
    stream = file or sys.stdout
    stream.write(message + "\n")
    stream.flush()
