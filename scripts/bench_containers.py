#!/usr/bin/env python3
"""Round trip and training time between two containers, with the old and the current MPI defaults.

Starts two containers of the CPU image as two hosts (scripts/podman_build.sh up: nodea, nodeb on a podman
network, sshd in each), then measures, from nodea:
  - the round trip of an 8-byte message over plain TCP (Python sockets), and with MPI (mpi4py ping-pong under
    mpirun, --mpi-runs fresh mpiruns per set of Open MPI flags in MPI_VARIANTS: whether a run is slow is decided
    when it starts), plus the time of a 4 MiB round trip;
  - a 2-rank training run (tests' launch job, or --steps) under horovodrun --gloo, horovodrun --mpi and
    mpirun, each with the command the launch/ scripts ran before (Horovod's documented flags only) and with
    the launch/ scripts as they are now.
Prints a table and writes JSON (--json). Needs root, podman and the image (scripts/podman_build.sh build).

    sudo scripts/bench_containers.py [--tag localhost/horovod-train:cpu] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # horovod_train.launching needs only the standard library
from horovod_train.launching import LAUNCHERS  # noqa: E402

PREFIX = "hvtbench"
HOSTS = "nodea:1,nodeb:1"
ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# The mpirun command lines compared, from the mpirun row: name -> (exclude_ofi, yield_when_idle).
# Before issue 12 launch/mpirun.sh and horovodrun --mpi ran Horovod's documented flags only; after, Open MPI's
# libfabric BTL is excluded too.
MPI_VARIANTS = {
    "before: documented flags": (False, False),
    "before + yield when idle": (False, True),
    "after: + libfabric BTL (ofi) excluded": (True, False),
}
JOB = [
    "--synthetic_num_examples", "600", "--num_train_epochs", "1", "--per_device_train_batch_size", "16",
    "--per_device_eval_batch_size", "60", "--logging_steps", "10", "--disable_tqdm",
]  # fmt: skip

PINGPONG = """
import sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
def rtt(nbytes, n):
    buf = np.zeros(nbytes, dtype=np.uint8)
    times = []
    for i in range(n + 10):
        comm.Barrier()
        t = time.perf_counter()
        if rank == 0:
            comm.Send(buf, dest=1); comm.Recv(buf, source=1)
        else:
            comm.Recv(buf, source=0); comm.Send(buf, dest=0)
        if i >= 10:
            times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]
small, large = rtt(8, int(sys.argv[1])), rtt(4 << 20, 20)
if rank == 0:
    print(f"RTT {small * 1e6:.1f} {large * 1e3:.2f}")
"""
TCP_SERVER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5999)); s.listen(1)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (data := c.recv(8)):
    c.sendall(data)
"""
TCP_CLIENT = """
import socket, sys, time
for _ in range(50):
    try:
        c = socket.create_connection(("nodeb", 5999)); break
    except OSError:
        time.sleep(0.1)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for i in range(int(sys.argv[1])):
    t = time.perf_counter(); c.sendall(b"x" * 8); n = 0
    while n < 8:
        n += len(c.recv(8 - n))
    times.append(time.perf_counter() - t)
times.sort()
print(f"RTT {times[len(times) // 2] * 1e6:.1f}")
"""


def podman(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


def on_a(*cmd: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = [arg for name, value in ENV.items() for arg in ("-e", f"{name}={value}")]
    proc = podman("exec", *env, f"{PREFIX}-a", *cmd, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def mpirun(variant: tuple[bool, bool], *cmd: str, forward: tuple[str, ...] = ()) -> list[str]:
    """2 ranks, one on each container (as root there), -x PATH and ``forward``."""
    exclude_ofi, yield_when_idle = variant
    return LAUNCHERS["mpirun"].command(cmd, 2, env={}, hosts=HOSTS, forward=forward, exclude_ofi=exclude_ofi,
                                       yield_when_idle=yield_when_idle, root=True)  # fmt: skip


def tcp_rtt(n: int) -> float:
    podman("exec", "-d", f"{PREFIX}-b", "python", "-c", TCP_SERVER)
    out = on_a("python", "-c", TCP_CLIENT, str(n)).stdout
    return float(out.split("RTT ")[1].split()[0])


def mpi_rtt(variant: tuple[bool, bool], n: int, runs: int) -> dict:
    """Each run is a fresh mpirun (whether a run is slow is decided at its start): every run's median."""
    small, large = [], []
    for _ in range(runs):
        command = mpirun(variant, "python", "-c", PINGPONG, str(n))
        out = on_a(*command).stdout
        words = out.split("RTT ")[1].split()
        small.append(float(words[0]))
        large.append(float(words[1]))
    return {"command": command[:-4], "rtt_8B_us": sorted(small), "rtt_4MiB_ms": sorted(large)}


def train(name: str, cmd: list[str], out: Path, repeats: int) -> dict:
    walls, trains = [], []
    for i in range(repeats):
        start = time.monotonic()
        on_a(*cmd, *JOB, "--output_dir", f"/out/{name}-{i}")
        walls.append(time.monotonic() - start)
        trains.append(json.loads((out / f"{name}-{i}" / "all_results.json").read_text())["wall_time_s"])
    return {"wall_s": statistics.median(walls), "train_s": statistics.median(trains), "runs": repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tag", default="localhost/horovod-train:cpu")
    parser.add_argument("--repeats", type=int, default=3, help="training runs per launcher (median)")
    parser.add_argument("--pings", type=int, default=300, help="round trips per mpirun (median)")
    parser.add_argument("--mpi-runs", type=int, default=8, help="mpiruns per set of flags")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--skip-training", action="store_true")
    args = parser.parse_args()
    result: dict = {"tcp_rtt_us": None, "mpi": {}, "training": {}}
    with tempfile.TemporaryDirectory(prefix="hvt-bench-") as tmp:
        out = Path(tmp)
        try:
            up = subprocess.run(
                [str(ROOT / "scripts" / "podman_build.sh"), "up", "--prefix", PREFIX, "--tag", args.tag,
                 "--volume", f"{out}:/out"],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            if up.returncode != 0:
                sys.exit(up.stdout + up.stderr)
            result["tcp_rtt_us"] = tcp_rtt(args.pings)
            print(f"{'plain TCP':45s} round trip {result['tcp_rtt_us']:9.1f} us", flush=True)
            for name, variant in MPI_VARIANTS.items():
                result["mpi"][name] = got = mpi_rtt(variant, args.pings, args.mpi_runs)
                slow = sum(rtt > 200 for rtt in got["rtt_8B_us"])
                print(f"{'MPI ' + name:45s} round trip per run (us): {', '.join(f'{r:.0f}' for r in got['rtt_8B_us'])}"
                      f"  [{slow}/{len(got['rtt_8B_us'])} runs > 200 us]; 4 MiB median "
                      f"{statistics.median(got['rtt_4MiB_ms']):.1f} ms", flush=True)  # fmt: skip
            if not args.skip_training:
                runs = {
                    "horovodrun --gloo": ["launch/horovodrun_multihost.sh", "-H", HOSTS, "--gloo", "--"],
                    "horovodrun --mpi, before": LAUNCHERS["horovodrun"].command(
                        ["python", "-m", "horovod_train", "train"], 2, controller="mpi", hosts=HOSTS, exclude_ofi=False,
                    ),
                    "horovodrun --mpi, launch/horovodrun_multihost.sh": [
                        "launch/horovodrun_multihost.sh", "-H", HOSTS, "--mpi", "--",
                    ],
                    "mpirun, before": mpirun(
                        MPI_VARIANTS["before: documented flags"], "python", "-m", "horovod_train", "train",
                        forward=tuple(ENV),
                    ),
                    "mpirun, launch/mpirun.sh": ["launch/mpirun.sh", "-H", HOSTS, "--"],
                }  # fmt: skip
                for name, cmd in runs.items():
                    slug = name.replace(" ", "_").replace("/", "_").replace(",", "").replace("-", "")
                    result["training"][name] = stats = train(slug, cmd, out, args.repeats)
                    print(f"{'train: ' + name:45s} {stats['wall_s']:6.1f} s (training {stats['train_s']:.1f} s)",
                          flush=True)  # fmt: skip
        finally:
            subprocess.run([str(ROOT / "scripts" / "podman_build.sh"), "down", "--prefix", PREFIX], timeout=120)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
