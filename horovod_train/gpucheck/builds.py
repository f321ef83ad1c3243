"""The GPU check's Horovod builds, side by side (its step ``horovod``; ``python -m horovod_train.gpucheck.builds``):

* ``horovod``: into the running python's environment, with NCCL on a GPU node (``--nccl``): the collectives at
  np=1, the bench, the training steps;
* ``horovod_gloo``: without NCCL, into a second environment (``--gloo_env``) that sees the first one's packages
  and has a Horovod of its own: CUDA tensors go through Gloo on the host, so two ranks can share the one GPU
  (NCCL refuses that) and Horovod's gradient all-reduce runs for real. Without ``--gloo_env`` (a CPU torch:
  the first build has no NCCL anyway) it is the first one.

Both run scripts/build_horovod.sh at once (the second one niced: the first comes first), each with its own log;
wheels kept by an earlier run (``--parts_from``) are restored into the wheel cache first, and are then installed
instead of built. The last line is JSON: each build's status, seconds and log. Standard library only."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import time
import venv
from pathlib import Path

from horovod_train.gpucheck.wheels import restore

PTH = "horovod-train-gpu-check-parent.pth"


def parent_site_dirs() -> list[str]:
    """The site-packages folders the running python imports from (the node's torch and the installed
    dependencies among them)."""
    return [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]


def make_gloo_env(folder: Path) -> str:
    """A venv over this python whose own site-packages come first and then this environment's, through a .pth
    that runs site.addsitedir (so their .pth files run too: setuptools' distutils shim, which Horovod's CMake
    imports on Python 3.12). Its python, made once and kept."""
    python = folder / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(with_pip=False, symlinks=True).create(folder)
    own = Path(sysconfig.get_path("purelib", vars={"base": str(folder), "platbase": str(folder)}))
    lines = [f"import site; site.addsitedir({path!r})" for path in parent_site_dirs()]
    (own / PTH).write_text("\n".join(lines) + "\n")
    return str(python)


def start(name: str, python: str, args: list[str], scripts: Path, logs: Path, nice: bool) -> subprocess.Popen:
    env = dict(os.environ, PYTHON=python)
    if name != "horovod":
        env.pop("HOROVOD_WHEEL", None)  # a prebuilt wheel from the bundle is the NCCL build's
    cmd = [*(["nice", "-n", "5"] if nice else []), "bash", str(scripts / "build_horovod.sh"), *args]
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / f"{name}.log").open("w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_all(procs: dict[str, subprocess.Popen], started: float) -> dict[str, tuple[int, float]]:
    """Each build's exit status and its own duration, in the order they finish."""
    done: dict[str, tuple[int, float]] = {}
    while len(done) < len(procs):
        for name, proc in procs.items():
            if name not in done and proc.poll() is not None:
                done[name] = (proc.returncode, round(time.monotonic() - started, 1))
        time.sleep(0.2)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m horovod_train.gpucheck.builds", description=__doc__)
    parser.add_argument("--scripts_dir", type=Path, required=True)
    parser.add_argument("--logs", type=Path, required=True, help="one log per build")
    parser.add_argument("--nccl", action="store_true", help="the first build with NCCL (a GPU node)")
    parser.add_argument("--gloo_env", type=Path, help="the second environment (without it: no second build)")
    parser.add_argument("--parts_from", type=Path, help="a folder with kept wheels (horovod-wheels.tar.NN)")
    parser.add_argument("--plan_only", action="store_true", help="build_horovod --dry-run: print what it would do")
    args = parser.parse_args(argv)
    cache = Path(os.environ["HOROVOD_WHEEL_CACHE"])
    if args.parts_from:
        for key in restore(args.parts_from, cache):
            print(f"[builds] restored the kept wheel {key} into {cache}", flush=True)
    plan_only = ["--dry-run"] if args.plan_only else []
    builds = {"horovod": (sys.executable, [*(["--with-nccl"] if args.nccl else []), *plan_only])}
    if args.gloo_env:
        builds["horovod_gloo"] = (make_gloo_env(args.gloo_env), ["--without-nccl", *plan_only])
    started = time.monotonic()
    procs = {
        name: start(name, python, flags, args.scripts_dir, args.logs, nice=i > 0)
        for i, (name, (python, flags)) in enumerate(builds.items())
    }
    results = {}
    for name, (code, seconds) in wait_all(procs, started).items():
        results[name] = {"ok": code == 0, "exit": code, "seconds": seconds, "python": builds[name][0],
                         "log": str(args.logs / f"{name}.log"), "plan_only": args.plan_only}  # fmt: skip
        print(f"[builds] {name}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {seconds:.0f}s", flush=True)
    if "horovod_gloo" not in results:
        results["horovod_gloo"] = {**results["horovod"], "same_as": "horovod"}
    print(json.dumps({"builds": results}))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
