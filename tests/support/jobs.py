"""Run the real CLI under a real launcher on small jobs: commands, environment, results."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from horovod_train.launching import LAUNCHERS

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# A job small enough for seconds per run, big enough to learn well above chance.
SMALL_JOB = [
    "--model_name_or_path",
    "tiny-bert",
    "--dataset_name",
    "synthetic-nli",
    "--synthetic_num_examples",
    "1200",
    "--per_device_train_batch_size",
    "16",
    "--per_device_eval_batch_size",
    "50",
    "--learning_rate",
    "2e-4",
    "--num_train_epochs",
    "1",
    "--logging_steps",
    "10",
    "--disable_tqdm",
]


def base_env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HOROVOD_TRAIN_CACHE=str(cache_dir),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        OMP_NUM_THREADS="1",
    )
    return env


def run(cmd: list[str], cache_dir: Path, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=REPO, env=base_env(cache_dir), capture_output=True, text=True, timeout=timeout, **kwargs
    )


def train_cmd(*args: str) -> list[str]:
    return [str(BIN / "python"), "-m", "horovod_train", "train", *args]


def launch(launcher: str, program: list[str], processes: int = 2) -> list[str]:
    """``program`` as ``processes`` ranks on this machine under a row of the launcher table, as compare starts it;
    mpirun forwards the variables of the tests' environment (base_env: only the names matter here)."""
    return LAUNCHERS[launcher].local_command(program, processes, env=base_env(REPO))


def horovodrun(np: int, *args: str, controller: str = "--gloo") -> list[str]:
    row = LAUNCHERS["horovodrun"]
    return row.command(train_cmd(*args), np, controller=controller.removeprefix("--"), executable=row.find_tool())


def mpirun(np: int, *args: str) -> list[str]:
    return launch("mpirun", train_cmd(*args), np)


def read_results(output_dir: Path) -> dict:
    return json.loads((output_dir / "all_results.json").read_text())


def cli_here(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m horovod_train ARGV` run inside this process with ``env`` set (and ``cwd``, if given), its exit
    status and what it printed returned as `run` returns a launch's. It pays no start-up (5 s of CPU: torch and
    transformers are imported); the processes it launches are real ones. The environment is its own (conftest's
    autouse fixtures give a test back its environment and the stop signals' handlers)."""
    from horovod_train.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        for name, value in env.items():
            if os.environ.get(name) != value:
                patch.setenv(name, value)
        if cwd is not None:
            patch.chdir(cwd)
        try:
            code = main(argv)
        except SystemExit as exited:
            code = exited.code
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def train_here(cache_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m horovod_train train ARGS` (one process: --engine single) run inside this one (cli_here), with the
    tests' offline variables."""
    offline = {k: v for k, v in base_env(cache_dir).items() if k.startswith(("HOROVOD_TRAIN_", "HF_", "TRANSFORMERS_"))}
    return cli_here(["train", *args], offline)


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    )


def torchrun(np: int, *args: str) -> list[str]:
    """`torchrun --standalone`: a free rendezvous port, so concurrent jobs do not collide on 29500."""
    return launch("torchrun", train_cmd(*args), np)


def probe_launch(launcher: str, program: list[str]) -> list[str]:
    """A program (a tests/probes script, a command of the package) under a launcher of the table: 2 real ranks, or one
    process under plain python."""
    return launch(launcher, program, 1 if LAUNCHERS[launcher].fallback else 2)
