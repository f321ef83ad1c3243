"""A real two-node SLURM cluster on one machine: slurmctld (and munged, one key) here, and two slurmd daemons as
nodes nodeA (10.78.N.1) and nodeB (10.78.N.2), each in its own network namespace (a veth on a bridge that
holds the controller's 10.78.N.254; N: a /24 no other test run on the machine has), UTS namespace (its hostname) and
PID namespace (its own process table),
with its own NodeName/NodeAddr, spool directory, log and pid file. The launch/slurm jobs are submitted with
`-N 2 --ntasks-per-node 1`: one rank on each node."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import launch as net  # the namespaces that make the nodes
from support.jobs import BIN, read_results
from support.launch import LAUNCH_JOB, free_port, launch_env, rank_map
from support.machine import SESSION, machine_lock
from support.slurm import (
    STOP_JOB,
    SlurmCluster,
    assert_completed,
    assert_resumed_exactly,
    check_training,
    require_slurm,
    running,
    stop_and_resume,
)

pytestmark = pytest.mark.slow

NODES = ("nodeA", "nodeB")


class TwoNodes(SlurmCluster):
    """The cluster of slurm_support, each slurmd started inside its node's namespaces; addresses chosen at start."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, nodes=dict.fromkeys(NODES, ""))
        self.netns = {node: f"hvts{SESSION}{node[-1].lower()}" for node in NODES}
        self.bridge = f"hvtbr{SESSION}"
        self.etc_created = not Path("/etc/netns").exists()
        self.links: list[str] = []

    def slurmd_command(self, node: str) -> list[str]:
        return net.on_host(self.netns[node], node, super().slurmd_command(node), own_pids=True)

    def start(self) -> None:
        with machine_lock("subnets"):  # until the bridge has its address: then other test runs see the subnet taken
            subnet = net.free_subnet("10.78")
            self.nodes = {node: f"{subnet}.{n}" for n, node in enumerate(NODES, start=1)}
            self.ctld_addr = f"{subnet}.254"
            net.sh("ip", "link", "add", self.bridge, "type", "bridge")
            self.links.append(self.bridge)
            net.sh("ip", "addr", "add", f"{self.ctld_addr}/24", "dev", self.bridge)
        net.sh("ip", "link", "set", self.bridge, "up")
        names = {**self.nodes, self.host: self.ctld_addr}
        for node, ns in self.netns.items():
            net.sh("ip", "netns", "add", ns)
            outside, inside = f"{ns}o", f"{ns}i"
            net.sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            self.links.append(outside)
            net.sh("ip", "link", "set", outside, "master", self.bridge)
            net.sh("ip", "link", "set", outside, "up")
            net.netns_host(ns, inside, self.nodes[node], names)
        super().start()

    def stop(self) -> None:
        try:
            super().stop()  # slurmd first: each is its node's PID 1, so its job processes go with it
        finally:
            net.remove_netns(list(self.netns.values()), self.etc_created)
            for link in self.links:  # the veths went with their namespaces; the bridge stays until deleted
                subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[TwoNodes]:
    net.require_netns()
    require_slurm()
    with running(TwoNodes(tmp_path_factory.mktemp("slurm2"))) as two:
        yield two


def submit(cluster: TwoNodes, job: str, *args: str, workdir: Path, cache_dir: Path) -> str:
    env = launch_env(cache_dir, HVT_RDZV_PORT=str(free_port()))
    return cluster.submit(job, *args, env=env, workdir=workdir, nodes=2, tasks=1)[0]


JOBS = [
    ("horovod_srun", "horovod", f"+ srun --mpi=pmix --kill-on-bad-exit=1 {BIN}/python -m horovod_train "),
    ("horovod_mpirun", "horovod", "-np 2 -H nodeA:1,nodeB:1 --"),
    ("ddp_torchrun", "ddp", "--nnodes 2 --nproc_per_node 1 --rdzv_id"),
]


@pytest.fixture(scope="module")
def uninterrupted(cluster, tmp_path_factory, cache_dir) -> Callable[[], tuple[Path, str]]:
    """horovod_srun's STOP_JOB run to the end across both nodes, submitted once per module (output directory, job
    output): the training test's horovod_srun case reads it, and the warning-signal test's requeued run must end
    like it. One 2-rank job for both."""
    done: list[tuple[Path, str]] = []

    def finished() -> tuple[Path, str]:
        if not done:
            workdir = tmp_path_factory.mktemp("horovod_srun")
            out = workdir / "reference"
            job = submit(cluster, "horovod_srun", *STOP_JOB, "--output_dir", str(out), workdir=workdir,
                         cache_dir=cache_dir)  # fmt: skip
            done.append((out, assert_completed(cluster.wait(job, timeout=480))))
        return done[0]

    return finished


@pytest.mark.parametrize(("job", "engine", "command"), JOBS, ids=[j[0] for j in JOBS])
def test_job_runs_one_rank_on_each_node(cluster, uninterrupted, tmp_path, cache_dir, job, engine, command) -> None:
    """`doctor` and a training run, submitted together (each job takes one CPU of each node); horovod_srun's
    training run is the module's uninterrupted one (the warning-signal test's reference)."""
    (tmp_path / "doctor").mkdir()
    doctor_args = ["doctor"] if engine == "ddp" else ["doctor", "--engine", engine]  # ddp_torchrun adds its own
    doctor = submit(cluster, job, *doctor_args, workdir=tmp_path / "doctor", cache_dir=cache_dir)
    if job == "horovod_srun":
        out, output = uninterrupted()
    else:
        out = tmp_path / "run"
        train = submit(cluster, job, *LAUNCH_JOB, "--output_dir", str(out), workdir=tmp_path, cache_dir=cache_dir)
    fields = cluster.wait(doctor, timeout=240)
    assert fields["NumNodes"] == "2" and fields["NodeList"] == "nodeA,nodeB", fields
    report = assert_completed(fields)
    assert rank_map(report) == [(0, 0, "nodeA", "cpu"), (1, 0, "nodeB", "cpu")], report[-3000:]
    assert f"joined with engine {engine}" in report
    if job != "horovod_srun":
        output = assert_completed(cluster.wait(train, timeout=480))
    assert "[slurm] job" in output and "2 node(s) (nodeA,nodeB), 1 task(s) per node" in output, output[-3000:]
    assert command in output, output[-3000:]
    if job == "ddp_torchrun":
        assert f"--rdzv_backend c10d --rdzv_endpoint {cluster.nodes['nodeA']}:" in output
    results = check_training(out, engine)
    if engine == "horovod":
        assert results["controller"] == "mpi", results


def test_fsdp_across_two_nodes_is_hsdp_one_replica_per_node(cluster, tmp_path, cache_dir) -> None:
    """HSDP's default on several nodes: srun starts one torchrun a node, each its node's two ranks; one replica per
    node, the state sharded over a node's ranks (a 2 x 2 mesh: all-gathers inside a node, the gradient's all-reduce
    across), every rank ending with the same parameters."""
    out = tmp_path / "run"
    env = launch_env(cache_dir, HVT_RDZV_PORT=str(free_port()), HVT_ENGINE="fsdp")
    job = cluster.submit("ddp_torchrun", *LAUNCH_JOB, "--output_dir", str(out), env=env, workdir=tmp_path, nodes=2,
                         tasks=2)[0]  # fmt: skip
    output = assert_completed(cluster.wait(job, timeout=480))
    assert "2 node(s) (nodeA,nodeB), 2 task(s) per node" in output, output[-3000:]
    results = read_results(out)
    assert results["world_size"] == 4 and results["engine"] == "fsdp", results
    assert results["mesh"] == {"replicate": 2, "shard": 2}, results
    assert len(set(results["param_checksum_per_rank"])) == 1, results


def test_warning_signal_reaches_both_nodes_and_the_requeued_job_resumes(cluster, uninterrupted, tmp_path, cache_dir):
    """The preemption path across nodes: the batch shell (on nodeA) passes SIGUSR1 to the ranks of both nodes
    (one `srun --overlap` task per node, each seeing only its node's processes), one checkpoint, requeue,
    auto-resume, and the parameters of the module's uninterrupted run."""
    reference, stopped = uninterrupted()[0], tmp_path / "stopped"
    job_id = submit(
        cluster, "horovod_srun", *STOP_JOB, "--output_dir", str(stopped), workdir=tmp_path, cache_dir=cache_dir
    )
    started = time.monotonic()
    _, output, stop = stop_and_resume(cluster, job_id, stopped)
    signalled = set(re.findall(r"\[slurm\] SIGUSR1 -> rank processes [\d ]+ on (node[AB])", output))
    assert signalled == {"nodeA", "nodeB"}, output[-4000:]
    assert len(re.findall(r"stopped by SIGUSR1 at step", output)) == 1, output[-4000:]
    assert_resumed_exactly(reference, stopped, "horovod", "two nodes", stop, started)
