"""Two "hosts" on one machine: network namespaces hostA (10.77.0.1) and hostB (10.77.0.2) joined only by a veth
pair named hvt0 on both sides, each with its own hostname and an sshd (docker/sshd_config: key-only, throwaway
key, port 2222). horovodrun and mpirun, through the launch/ scripts, start one rank on each host over ssh."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.jobs import REPO, assert_ok, read_results
from support.launch import (
    LAUNCH,
    LAUNCH_JOB,
    NIC,
    effective_command,
    ensure_commands,
    launch_env,
    netns_host,
    on_host,
    rank_map,
    remove_netns,
    require_netns,
    sh,
)
from support.machine import SESSION

pytestmark = pytest.mark.slow

SSH_PORT = 2222
HOSTS = {"hostA": "10.77.0.1", "hostB": "10.77.0.2"}


class TwoHosts:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.netns = {"hostA": f"hvt{SESSION}a", "hostB": f"hvt{SESSION}b"}
        self.veth = (f"hvtv{SESSION}a", f"hvtv{SESSION}b")
        self.key = root / "id_ed25519"
        self.sshd: dict[str, subprocess.Popen] = {}
        self.etc_created = not Path("/etc/netns").exists()

    def on(self, host: str, cmd: list[str]) -> list[str]:
        """``cmd`` as run on ``host``: in its network namespace, with its own hostname."""
        return on_host(self.netns[host], host, cmd)

    def start(self) -> None:
        a, b = self.netns["hostA"], self.netns["hostB"]
        sh("ip", "netns", "add", a)
        sh("ip", "netns", "add", b)
        sh("ip", "link", "add", self.veth[0], "type", "veth", "peer", "name", self.veth[1])
        for (host, ns), veth in zip(self.netns.items(), self.veth, strict=True):
            etc = netns_host(ns, veth, HOSTS[host], HOSTS)
            # An ssh client config that keeps root's known_hosts untouched.
            (etc / "ssh").mkdir()
            (etc / "ssh" / "ssh_config").write_text(
                "Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n"
                "    BatchMode yes\n    LogLevel ERROR\n"
            )
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / "host_key"))
        (self.root / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        for host, ip in HOSTS.items():
            sshd = ["/usr/sbin/sshd", "-D", "-e", "-f", str(REPO / "docker" / "sshd_config"), "-p", str(SSH_PORT)]
            sshd += ["-o", f"ListenAddress={ip}", "-o", f"HostKey={self.root / 'host_key'}", "-o", "PidFile=none"]
            sshd += ["-o", f"AuthorizedKeysFile={self.root / 'authorized_keys'}", "-o", "StrictModes=no"]
            log = open(self.root / f"sshd-{host}.log", "w")  # noqa: SIM115 (kept open for sshd's lifetime)
            self.sshd[host] = subprocess.Popen(
                self.on(host, sshd), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        probe = self.on("hostA", ["ssh", "-p", str(SSH_PORT), "-i", str(self.key), "hostB", "hostname"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            proc = subprocess.run(probe, capture_output=True, text=True, timeout=30)
            if proc.stdout.strip() == "hostB":
                return
            time.sleep(0.5)
        raise AssertionError(f"no ssh from hostA to hostB: {proc.stderr}\n{self.sshd_log('hostB')}")

    def sshd_log(self, host: str) -> str:
        return (self.root / f"sshd-{host}.log").read_text()

    def stop(self) -> None:
        for proc in self.sshd.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=20)
        remove_netns(list(self.netns.values()), self.etc_created)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory) -> Iterator[TwoHosts]:
    require_netns()
    ensure_commands({"/usr/sbin/sshd": "openssh-server", "ssh": "openssh-client"})
    root = tmp_path_factory.mktemp("hosts")
    root.chmod(0o700)
    two = TwoHosts(root)
    try:
        two.start()
        yield two
    finally:
        two.stop()


def launch_on_a(hosts: TwoHosts, script: str, *args: str, cwd: Path, env: dict[str, str]) -> str:
    """Run a launch/ script on hostA; check that it logged in to hostB's sshd from hostA's address."""
    seen = len(hosts.sshd_log("hostB"))
    cmd = hosts.on("hostA", [str(LAUNCH / script), *args])
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=480)
    assert_ok(proc)
    assert f"Accepted publickey for root from {HOSTS['hostA']}" in hosts.sshd_log("hostB")[seen:]
    return proc.stdout


SSH = ["--ssh-port", str(SSH_PORT)]


def check_two_hosts(stdout: str) -> None:
    assert rank_map(stdout) == [(0, 0, "hostA", "cpu"), (1, 0, "hostB", "cpu")], stdout[-3000:]


def check_training(out: Path, controller: str) -> None:
    results = read_results(out)
    assert results["world_size"] == 2 and results["controller"] == controller, results
    assert results["param_checksum_per_rank"][0] == results["param_checksum_per_rank"][1]


def test_horovodrun_places_one_rank_per_host(hosts, tmp_path, cache_dir) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# one slot per host\nhostA slots=1\nhostB slots=1\n")
    remote = [*SSH, "--ssh-identity-file", str(hosts.key), "--network-interfaces", NIC]
    env = launch_env(cache_dir)
    stdout = launch_on_a(
        hosts, "horovodrun_multihost.sh", "--hostfile", str(hostfile), *remote, "--", "doctor", cwd=tmp_path, env=env
    )
    assert "launcher: horovodrun, world size 2, joined with engine horovod (controller gloo)" in stdout
    check_two_hosts(stdout)

    out = tmp_path / "run"
    stdout = launch_on_a(
        hosts,
        "horovodrun_multihost.sh",
        "-H",
        "hostA:1,hostB:1",
        *remote,
        "--",
        *LAUNCH_JOB,
        "--output_dir",
        str(out),
        cwd=tmp_path,
        env=env,
    )
    assert effective_command(stdout, "horovodrun").startswith(
        f"+ horovodrun -np 2 -H hostA:1,hostB:1 --ssh-port {SSH_PORT} --ssh-identity-file {hosts.key} --gloo "
        f"--network-interfaces {NIC} "
    )
    check_training(out, "gloo")


def mpirun_maps(stdout: str) -> list[dict[str, list[int]]]:
    """{host: its ranks} of each job map Open MPI prints as it starts the ranks (rmaps_base_display_map; 4.1 prints
    the same map twice)."""
    maps: list[dict[str, list[int]]] = []
    host = None
    for line in stdout.splitlines():
        if "JOB MAP" in line:
            maps.append({})
        elif node := re.search(r"Data for node: (\S+)", line):
            host = node[1]
        elif (rank := re.search(r"Process rank: (\d+)", line)) and maps and host is not None:
            maps[-1].setdefault(host, []).append(int(rank[1]))
    return maps


def test_mpirun_places_one_rank_per_host(hosts, tmp_path, cache_dir) -> None:
    """One training launch: the ssh and interface flags in mpirun's command, Open MPI's own map of the job (one rank
    on each host), the run under the MPI controller. The ranks' own report of their hosts under mpirun.sh (doctor's
    rank map) is tests/system/test_docker_build.py::test_doctor_places_one_rank_in_each_container's."""
    remote = ["-H", "hostA:1,hostB:1", *SSH, "--ssh-identity-file", str(hosts.key), "--network-interfaces", NIC]
    env = launch_env(cache_dir, OMPI_MCA_rmaps_base_display_map="1")
    out = tmp_path / "run"
    stdout = launch_on_a(
        hosts, "mpirun.sh", *remote, "--", *LAUNCH_JOB, "--output_dir", str(out), cwd=tmp_path, env=env
    )
    command = effective_command(stdout, "mpirun")
    assert f"-mca plm_rsh_args '-p {SSH_PORT} -i {hosts.key}'" in command
    assert f"-mca btl_tcp_if_include {NIC} -mca oob_tcp_if_include {NIC}" in command
    maps = mpirun_maps(stdout)
    assert maps and all(m == {"hostA": [0], "hostB": [1]} for m in maps), stdout[-3000:]
    check_training(out, "mpi")


def test_fsdp_under_mpirun_on_two_hosts_is_hsdp_one_replica_per_host(hosts, tmp_path, cache_dir) -> None:
    """HSDP's default across hosts: mpirun starts two ranks on each host, `--engine fsdp` meets over env:// (the
    address agreed over MPI) and builds one replica per host, the state sharded over a host's ranks (a 2 x 2 mesh);
    every rank ends with the same parameters."""
    remote = ["-H", "hostA:2,hostB:2", *SSH, "--ssh-identity-file", str(hosts.key), "--network-interfaces", NIC]
    out = tmp_path / "run"
    launch_on_a(hosts, "mpirun.sh", *remote, "--", *LAUNCH_JOB, "--engine", "fsdp", "--output_dir", str(out),
                cwd=tmp_path, env=launch_env(cache_dir))  # fmt: skip
    results = read_results(out)
    assert results["world_size"] == 4 and results["engine"] == "fsdp", results
    assert results["mesh"] == {"replicate": 2, "shard": 2}, results
    assert len(set(results["param_checksum_per_rank"])) == 1, results
