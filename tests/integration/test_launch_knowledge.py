"""One source of launch knowledge (horovod_train/launching/): the command line the launch/ scripts read from it, word
for word, its one-line errors, and that it runs without torch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support.jobs import REPO

from horovod_train.launching import LAUNCHERS

PROGRAM = ["/opt/my env/bin/python", "-m", "horovod_train", "train", "--output_dir", "runs/a b"]


def _bash_launch_command(*args: str) -> subprocess.CompletedProcess:
    script = 'source launch/lib.sh && HVT_PY="$0" && hvt_launch_command "$@" && printf "<%s>\\n" "${HVT_LAUNCH[@]}"'
    return subprocess.run(["bash", "-c", script, sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_scripts_read_the_command_word_for_word() -> None:
    """Words with spaces, quotes and newlines reach the script as they were (NUL-separated)."""
    program = [*PROGRAM, "it's", "two\nlines", ""]
    proc = _bash_launch_command("horovodrun", "--np", "2", "--option=--timeline-filename", "--option=/t/a b",
                                "--", *program)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    words = re.findall(r"<(.*?)>\n", proc.stdout, flags=re.S)
    assert words == LAUNCHERS["horovodrun"].command(program, 2, options=["--timeline-filename", "/t/a b"])


def test_scripts_stop_on_a_bad_command_with_one_error_line() -> None:
    proc = _bash_launch_command("mpirun", "--np", "2", "--hosts", "a:1", "--hostfile", "h", "--", "x")
    assert proc.returncode == 2, proc
    assert proc.stderr.strip() == "error: both -H and --hostfile given; fix: pass one of them"
    assert proc.stdout == ""


def test_the_command_line_needs_only_the_standard_library(tmp_path: Path) -> None:
    """launch/slurm/horovod_apptainer.sbatch builds its srun with the node's python3, which has no torch."""
    argv = ["srun", "--mpi", "pmix", "--", "x"]
    probe = f"import sys, runpy; sys.modules['torch'] = None; sys.argv[1:] = {argv!r}"
    probe += "; runpy.run_module('horovod_train.launching', run_name='__main__')"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\0")[:-1] == ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", "x"]
