"""How one step of the GPU check runs: a subprocess in a process group of its own, its output copied line by
line into its log and the check's log (and the terminal, for the steps that print facts), under a timeout.
Whatever ends a step (its timeout, the check's SIGTERM or SIGINT, the check's budget) ends every process it
started, those its launcher moved into sessions of their own too (torchrun's workers, horovodrun's
middleman): a training process left behind would hold the GPU. Standard library only."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

GRACE_S = 10.0  # between SIGTERM and SIGKILL: torchrun stops its workers on SIGTERM, Horovod's middleman too


class CheckFailed(Exception):
    """A step ran but its result is wrong (accuracy too low, loss not decreasing, ...)."""


class Interrupted(Exception):
    """The check got SIGTERM or SIGINT: the step in flight is ended, the report written."""


@dataclasses.dataclass
class Step:
    name: str
    what: str
    cmd: list[str] | None  # None: nothing to run (``skip`` or ``error`` says why)
    estimate_s: float  # on one H100/H200 with 16 cores: an estimate until a run on the node measures it
    check: Callable[[Context, Step, str], tuple[str, dict[str, Any]]] | None = None
    timeout_s: float | None = None  # None: 3 x the estimate + 60 s
    needs_cuda: bool = False
    after: tuple[str, ...] = ()  # skipped unless these steps (or parts of a step) passed
    reads: tuple[str, ...] = ()  # steps whose files it reads: waited for too, and --steps naming it runs them
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    run_dir: Path | None = None
    skip: str | None = None
    error: str | None = None
    echo: bool = False  # its output goes to the terminal too (the facts printed before anything can fail)
    prepare: Callable[[Context, Step], None] | None = None  # adjusts the command to the earlier steps' results

    def __post_init__(self) -> None:
        self.after = tuple(dict.fromkeys((*self.after, *self.reads)))

    @property
    def limit_s(self) -> float:
        return self.timeout_s if self.timeout_s is not None else 3 * self.estimate_s + 60


@dataclasses.dataclass
class Context:
    args: argparse.Namespace
    python: str
    out: Path  # what comes back: the report, the table, the log, details.tar.gz, the kept Horovod wheels
    work: Path  # everything else (models, data caches, run directories)
    dry: bool
    deadline: float
    wheel_cache: Path = Path("/nonexistent")  # build_horovod's cache (HOROVOD_WHEEL_CACHE): kept between runs
    gloo_python: str = ""  # the python whose Horovod has no NCCL (2 ranks on one GPU); the main one on CPUs
    results: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    running: dict[str, Any] = dataclasses.field(default_factory=dict)  # the step in flight (the report shows it)
    interrupted: str | None = None  # the signal that ended the check

    @property
    def details(self) -> Path:
        """Logs, metrics and bench outputs of every step: packed into out/details.tar.gz after each step."""
        return self.work / "details"

    @property
    def log_file(self) -> Path:
        return self.out / "gpu_check.log"

    def tool(self, name: str, python: str | None = None) -> str:
        """A console script next to the python (horovodrun, torchrun), else from PATH."""
        local = Path(python or self.python).parent / name
        return str(local) if local.exists() else name

    def say(self, line: str) -> None:
        """A line on stdout and in the check's log (which comes back whole; the terminal keeps its end only)."""
        print(line, flush=True)
        with self.log_file.open("a") as log:
            log.write(line + "\n")

    def passed(self, name: str) -> bool:
        return self.results.get(name, {}).get("status") == "ok"


def log_path(ctx: Context, step: Step) -> Path:
    return ctx.details / "logs" / f"{step.name}.log"


def step_env(ctx: Context, step: Step) -> dict[str, str]:
    env = dict(os.environ)
    import_root = Path(__file__).resolve().parents[2]  # this copy of the package: the steps' python imports it
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(import_root), env.get("PYTHONPATH", "")) if p),
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HOROVOD_TRAIN_CACHE=str(ctx.work / "cache"),
        HOROVOD_WHEEL_CACHE=str(ctx.wheel_cache),
        PATH=f"{Path(ctx.python).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    if ctx.dry:  # the CPU, whatever the machine has: the plumbing, not the GPU
        env.update(CUDA_VISIBLE_DEVICES="")
        env.setdefault("OMP_NUM_THREADS", "1")
    env.update(step.env)
    return env


def why_not(ctx: Context, step: Step) -> str | None:
    """Why ``step`` is not run (skipped), or None."""
    if step.skip or (step.needs_cuda and ctx.dry):
        return step.skip or "needs CUDA (dry run)"
    missing = [name for name in step.after if not ctx.passed(name)]
    if missing:
        return f"needs step {', '.join(missing)}"
    left = ctx.deadline - time.monotonic()
    needed = 10 if ctx.dry else step.estimate_s  # a dry run's sizes are not the node's
    if needed > left:
        return f"time budget: needs ~{needed:.0f}s, {max(left, 0):.0f}s left"
    return None


def run_step(ctx: Context, step: Step) -> dict[str, Any]:
    """Run one step (unless skipped), check it, and return its report entry."""
    entry: dict[str, Any] = {"name": step.name, "what": step.what, "status": "ok", "seconds": 0.0, "detail": ""}
    entry |= {"estimate_s": step.estimate_s, "cmd": step.cmd}
    reason = why_not(ctx, step)
    if reason:
        return {**entry, "status": "skipped", "detail": reason}
    if step.prepare:
        step.prepare(ctx, step)
        entry["cmd"] = step.cmd
    if step.error:
        return {**entry, "status": "failed", "detail": step.error}
    if step.cmd is None:
        return {**entry, "detail": "nothing to do (all present)"}
    log = log_path(ctx, step)
    entry["log"] = str(log)
    timeout = max(1.0, min(step.limit_s, ctx.deadline - time.monotonic()))
    ctx.say(f"[gpu-check] {step.name}: {step.what} (~{step.estimate_s:.0f}s expected, timeout {timeout:.0f}s)")
    started = time.monotonic()
    returncode = run_logged(ctx, step, log, timeout)
    entry["seconds"] = round(time.monotonic() - started, 1)
    if returncode is None:
        return {**entry, "status": "failed", "detail": f"timeout {timeout:.0f}s"}
    text = log.read_text(errors="replace")
    if returncode != 0:
        return {**entry, "status": "failed", "detail": f"exit {returncode}: {last_line(text)}"}
    if step.check:
        try:
            entry["detail"], entry["metrics"] = step.check(ctx, step, text)
        except (CheckFailed, OSError, ValueError, KeyError, StopIteration) as exc:
            return {**entry, "status": "failed", "detail": f"check: {exc}"}
    return entry


def run_logged(ctx: Context, step: Step, log: Path, timeout: float) -> int | None:
    """The step's exit status, or None after its timeout; its output into its log and the check's log."""
    assert step.cmd is not None
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as own, ctx.log_file.open("a") as shared:
        header = f"==== {step.name}: {' '.join(step.cmd)}\n"
        own.write(header)
        shared.write(header)
        sinks = [own, shared, *([sys.stdout] if step.echo else [])]
        ctx.running = {"step": step.name, "since": time.time()}
        try:
            return run_in_own_group(step.cmd, step_env(ctx, step), sinks, timeout)
        finally:
            ctx.running = {}


def run_in_own_group(cmd: list[str], env: dict[str, str], sinks: Iterable[IO[str]], timeout: float) -> int | None:
    """Run ``cmd`` in a process group of its own, its output copied to ``sinks``; its exit status, or None
    after ``timeout``. However this returns (a timeout, an exception, Interrupted), every process it started
    is ended (``end_tree``)."""
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1, **group)  # fmt: skip
    copier = threading.Thread(target=copy_lines, args=(proc.stdout, list(sinks)), daemon=True)
    copier.start()
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        if proc.returncode is None:
            end_tree(proc)
        copier.join(timeout=GRACE_S)  # a worker that outlived everything would hold the pipe open


def copy_lines(source: IO[str], sinks: list[IO[str]]) -> None:
    for line in source:
        for sink in sinks:
            with contextlib.suppress(OSError, ValueError):  # a closed sink (the check is ending) loses the line
                sink.write(line)
                sink.flush()


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def tree_groups(root: int) -> set[int]:
    """The process groups of ``root`` and of all its descendants (a launcher's workers may sit in sessions of
    their own, where ending the step's group alone would not reach them)."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    groups, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            groups.add(table[pid][1])
        todo += children.get(pid, [])
    return groups - {os.getpgrp(), 0, 1}


def end_tree(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM to every process group of the step's tree, then SIGKILL to whatever of them is left (the groups
    are remembered: a worker whose launcher died has no parent in the tree any more)."""
    groups = tree_groups(proc.pid) | {proc.pid}
    signal_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    while time.monotonic() < deadline and any(alive(g) for g in groups):
        time.sleep(0.1)
    signal_groups(groups | tree_groups(proc.pid), signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)


def signal_groups(groups: set[int], sig: signal.Signals) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)


def alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:") or "Error" in line]
    return (errors or lines or [""])[-1].strip()[:300]


def raise_on_signals() -> None:
    """SIGTERM and SIGINT raise Interrupted in the main thread: the step in flight is ended through the
    ``finally`` of run_in_own_group, and the report is written before the check exits."""

    def interrupt(signum: int, _frame: Any) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut the cleanup short
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupt)
