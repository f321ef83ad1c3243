"""Shared by tests/test_launch_*.py: Debian packages on demand, running the launch/ scripts, reading their output."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from support.jobs import BIN, REPO, base_env
from support.machine import machine_lock

LAUNCH = REPO / "launch"
# The launch tests' job: tiny (2 cores shared with other work), still a real 2-rank training run.
LAUNCH_JOB = [
    "--synthetic_num_examples",
    "600",
    "--num_train_epochs",
    "1",
    "--per_device_train_batch_size",
    "16",
    "--per_device_eval_batch_size",
    "60",
    "--logging_steps",
    "10",
    "--disable_tqdm",
]
_RANK_ROW = re.compile(r"^(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+\S+$")  # rank, local_rank, host, device, device_rule
_TAG = re.compile(r"^\[\d+\]<std(?:out|err)>:")


def have(command: str) -> bool:
    return Path(command).is_file() if command.startswith("/") else shutil.which(command) is not None


def ensure_commands(packages: dict[str, str]) -> None:
    """Skip the calling test, saying what is missing, when a command it drives is not installed. `make test`
    installs them first (scripts/install_test_tools.sh); a test never installs anything itself."""
    missing = {command: package for command, package in packages.items() if not have(command)}
    if missing:
        wanted = " ".join(sorted(set(missing.values())))
        pytest.skip(f"needs {', '.join(missing)} (Debian: {wanted}): run `bash scripts/install_test_tools.sh` as root")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_env(cache_dir: Path, **extra: str) -> dict[str, str]:
    """The tests' environment; the scripts use this interpreter (HVT_PYTHON) rather than finding one."""
    env = base_env(cache_dir)
    env["HVT_PYTHON"] = str(BIN / "python")
    env["OMPI_MCA_mpi_yield_when_idle"] = "1"  # 2 cores shared with other work: idle MPI ranks must not spin
    env.update(extra)
    return env


def run_script(
    script: str, *args: str, cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run a launch/ script by absolute path from ``cwd`` (the scripts must work from any directory)."""
    return subprocess.run(
        [str(LAUNCH / script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def effective_command(stdout: str, program: str) -> str:
    """The '+ program ...' line a launch script prints before running it, with the program by its name (a script
    may print it by its path: printed_program)."""
    return f"+ {program} {printed_command(stdout, program).split(' ', 2)[2]}"


def printed_program(stdout: str, program: str) -> str:
    """The program of the '+ .../program ...' line as printed: a name or a path."""
    return printed_command(stdout, program).split(" ", 2)[1]


def printed_command(stdout: str, program: str) -> str:
    lines = [line for line in stdout.splitlines() if re.match(rf"\+ (\S*/)?{re.escape(program)} ", line)]
    assert lines, f"no '+ {program} ...' line in:\n{stdout[-3000:]}"
    return lines[0]


def assert_usage_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2 with one line, `error: PROBLEM; fix: FIX`, and nothing started."""
    detail = f"exit {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-2000:]}"
    assert proc.returncode == 2, detail
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, detail
    assert lines[0].startswith("error: ") and "; fix: " in lines[0], detail
    for needle in needles:
        assert needle in lines[0], detail
    assert not proc.stdout.startswith("+ "), detail


def rank_map(stdout: str) -> list[tuple[int, int, str, str]]:
    """(rank, local_rank, host, device) rows of `python -m horovod_train doctor`."""
    lines = [_TAG.sub("", line).strip() for line in stdout.splitlines()]
    header = r"rank\s+local_rank\s+host\s+device\s+device_rule"
    starts = [i for i, line in enumerate(lines) if re.fullmatch(header, line)]
    assert starts, f"no doctor rank map in:\n{stdout[-3000:]}"
    rows = []
    for line in lines[starts[0] + 1 :]:
        match = _RANK_ROW.match(line)
        if not match:
            break
        rows.append((int(match[1]), int(match[2]), match[3], match[4]))
    return sorted(rows)


# Hosts as network namespaces (tests/system/test_launch_multihost.py, tests/system/test_launch_slurm_two_nodes.py).
NIC = "hvt0"  # every namespace's interface has this name, as a real cluster's hosts would


def require_netns() -> None:
    """Skip unless this process can create network namespaces (root, iproute2, util-linux)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    ensure_commands({"ip": "iproute2", "unshare": "util-linux"})
    probe = subprocess.run(["ip", "netns", "add", f"hvtprobe{os.getpid()}"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create network namespaces here: {probe.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", f"hvtprobe{os.getpid()}"], check=True, timeout=30)


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


def netns_host(ns: str, veth: str, address: str, hosts: dict[str, str]) -> Path:
    """Give namespace ``ns`` the veth end ``veth`` as NIC with ``address``/24, up with its loopback, and an
    /etc/hosts naming every host (`ip netns exec` bind-mounts /etc/netns/NS/* over /etc/*). Returns that
    /etc/netns/NS directory."""
    sh("ip", "link", "set", veth, "netns", ns)
    sh("ip", "-n", ns, "link", "set", veth, "name", NIC)
    sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", NIC)
    sh("ip", "-n", ns, "link", "set", NIC, "up")
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    etc = Path("/etc/netns") / ns
    with machine_lock("etc-netns"):  # another run may be removing /etc/netns (remove_netns)
        etc.mkdir(parents=True)
    (etc / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{ip} {h}\n" for h, ip in hosts.items()))
    return etc


def on_host(ns: str, host: str, cmd: list[str], own_pids: bool = False) -> list[str]:
    """``cmd`` as run on ``host``: in network namespace ``ns``, with its own hostname and, with ``own_pids``,
    its own process table (killing the command then kills everything it started)."""
    if not own_pids:
        return ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh", *cmd]
    # nsenter rather than `ip netns exec`, which remounts /sys without the cgroup filesystems slurmd needs.
    setup = f'mount --bind /etc/netns/{ns}/hosts /etc/hosts && hostname {host} && exec "$@"'
    pids = ["--pid", "--fork", "--kill-child", "--mount-proc"]
    return ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount", *pids, "sh", "-c", setup, "sh", *cmd]


def remove_netns(names: list[str], etc_created: bool) -> None:
    for ns in names:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)  # takes its veth end along
        subprocess.run(["rm", "-rf", f"/etc/netns/{ns}"], timeout=30)
    with machine_lock("etc-netns"):  # another run's namespaces may be taking /etc/netns/NS (netns_host)
        if etc_created and Path("/etc/netns").is_dir() and not any(Path("/etc/netns").iterdir()):
            Path("/etc/netns").rmdir()


def free_subnet(prefix: str) -> str:
    """``prefix``.N (N from 0 to 255) whose /24 holds no address of this machine and overlaps no route. Call it under
    machine_lock("subnets") and hold that until the subnet's first address is assigned: another test run then sees it
    taken."""
    shown = [subprocess.run(["ip", "-4", "-o", *cmd], capture_output=True, text=True, check=True, timeout=30).stdout
             for cmd in (["addr", "show"], ["route", "show", "table", "all"])]  # fmt: skip
    used = [
        ipaddress.ip_network(word, strict=False)
        for word in re.findall(r"\b\d+\.\d+\.\d+\.\d+(?:/\d+)?", "\n".join(shown))
    ]
    for third in range(256):
        candidate = ipaddress.ip_network(f"{prefix}.{third}.0/24")
        if not any(candidate.overlaps(network) for network in used if network.prefixlen > 0):
            return f"{prefix}.{third}"
    raise AssertionError(f"every {prefix}.N.0/24 on this machine is in use")
