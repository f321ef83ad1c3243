"""The DDP and DataParallel engines on their own: uneven shards, node-local caches, launch mistakes, bad input.

Two nodes with node-local caches train on one tokenizer. The tokenizers library breaks ties between equally frequent
merges in hash order, so a tiny-bert tokenizer trained twice on the same texts differs (8 of 8 trainings on this job's
kind of texts); each node's local rank 0 used to train its own, and the ranks of the two nodes trained on different
token ids. Rank 0's tokenizer is now every node's: two torchrun agents on this machine stand for the nodes, each
with its own HOROVOD_TRAIN_CACHE. The same job carries the uneven shards (one launch for both), and one launch of
tests/probes/torchrun_workers_probe.py both the refusal of `--engine single` and DDP's find_unused_parameters."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.jobs import BIN, REPO, SMALL_JOB, assert_ok, base_env, probe_launch, read_results, run, train_here
from support.launch import free_port

from horovod_train.launching import LAUNCHERS


@dataclass
class TwoNodes:
    out: Path
    caches: list[Path]
    returncodes: list[int]
    outputs: list[str]

    def assert_ok(self) -> None:
        assert self.returncodes == [0, 0], "\n".join(o[-3000:] for o in self.outputs)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, cache_dir) -> TwoNodes:
    """DDP under two one-rank torchrun agents (the nodes), each with its own HOROVOD_TRAIN_CACHE, on 1001 examples."""
    root = tmp_path_factory.mktemp("two-nodes")
    out, port = root / "out", free_port()
    args = [*SMALL_JOB, "--synthetic_num_examples", "1001", "--per_device_train_batch_size", "7"]
    args += ["--per_device_eval_batch_size", "13", "--max_steps", "12", "--ddp_bucket_cap_mb", "1"]
    program = ["-m", "horovod_train", "train", *args, "--engine", "ddp", "--output_dir", str(out)]
    row = LAUNCHERS["torchrun"]
    cmd = row.command(program, 1, nnodes=2, rdzv_endpoint=f"127.0.0.1:{port}", executable=row.find_tool())
    caches = [root / "node0-cache", root / "node1-cache"]
    envs = [{**base_env(cache_dir), "HOROVOD_TRAIN_CACHE": str(cache)} for cache in caches]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    nodes = [subprocess.Popen(cmd, cwd=REPO, env=env, **pipes) for env in envs]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    return TwoNodes(out, caches, [node.returncode for node in nodes], outputs)


@pytest.mark.slow
def test_ddp_gathers_uneven_shards_exactly(two_nodes):
    """1001 examples: 101 validation examples, so rank 0 evaluates 51 and rank 1 50 (pad, gather, trim)."""
    two_nodes.assert_ok()
    results = read_results(two_nodes.out)
    assert (results["engine"], results["world_size"], results["launcher"]) == ("ddp", 2, "torchrun")
    assert (results["backend"], results["ddp_bucket_cap_mb"], results["eval_samples"]) == ("gloo", 1, 101)
    assert results["eval_accuracy_per_rank"] == [results["eval_accuracy"]] * 2
    assert len(set(results["param_checksum_per_rank"])) == 1
    assert len(results["peak_memory_mb_per_rank"]) == 2


def test_nodes_with_their_own_caches_train_on_rank_0s_tokenizer(two_nodes):
    two_nodes.assert_ok()
    assert read_results(two_nodes.out)["world_size"] == 2
    tokenizers = [sorted((cache / "tokenizers").glob("tiny-bert-*/tokenizer.json")) for cache in two_nodes.caches]
    assert all(len(found) == 1 for found in tokenizers), tokenizers
    assert tokenizers[0][0].read_bytes() == tokenizers[1][0].read_bytes(), "the nodes trained two tokenizers"


@pytest.mark.slow
def test_dp_on_cpu_says_so_once_and_trains(tmp_path, cache_dir):
    out = tmp_path / "dp"
    proc = train_here(cache_dir, *SMALL_JOB, "--engine", "dp", "--max_steps", "5", "--output_dir", str(out))
    assert_ok(proc)
    assert proc.stdout.count("no GPU visible") == 1
    results = read_results(out)
    assert (results["engine"], results["replicas"], results["global_step"]) == ("dp", 1, 5)


# What torchrun gives its first worker of two (the real launch: test_single_refuses_the_two_ranks_of_a_real_torchrun).
TORCHRUN_RANK_0 = {"TORCHELASTIC_RUN_ID": "none", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                   "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # fmt: skip


def test_dp_refuses_a_torchrun_workers_rank_as_single_does(tmp_path, cache_dir, monkeypatch):
    """dp's own setup makes the check single's makes (single.refuse_a_launcher): in this process, as rank 0 of 2."""
    for name, value in TORCHRUN_RANK_0.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "out"
    proc = train_here(cache_dir, *SMALL_JOB, "--engine", "dp", "--output_dir", str(out))
    assert proc.returncode != 0
    assert "error: --engine dp runs one process but torchrun started 2" in proc.stderr
    assert not out.exists()


@pytest.fixture(scope="module")
def torchrun_workers(tmp_path_factory, cache_dir) -> tuple[subprocess.CompletedProcess, Path]:
    """tests/probes/torchrun_workers_probe.py under a real torchrun: two workers refuse `--engine single` and
    `--engine horovod`, then train DDP with find_unused_parameters (one launch for three tests)."""
    out = tmp_path_factory.mktemp("torchrun-workers") / "out"
    program = [str(BIN / "python"), str(REPO / "tests" / "probes" / "torchrun_workers_probe.py")]
    return run(probe_launch("torchrun", [*program, *SMALL_JOB, "--output_dir", str(out)]), cache_dir, timeout=180), out


@pytest.mark.slow
def test_single_refuses_the_two_ranks_of_a_real_torchrun(torchrun_workers):
    """Each worker runs `train --engine single` (the command line's main) under a real torchrun: refused, exit 2."""
    proc, out = torchrun_workers
    assert_ok(proc)
    exits = [re.findall(rf"rank {rank}: --engine single exited (\S+)", proc.stdout) for rank in (0, 1)]
    assert exits == [["2"], ["2"]], proc.stdout
    assert "error: --engine single runs one process but torchrun started 2" in proc.stderr
    assert not out.exists()


@pytest.mark.slow
def test_horovod_refuses_the_two_ranks_of_a_real_torchrun(torchrun_workers):
    """Each worker ran a Horovod job of its own (world size 1: one trained, the other found --output_dir in use by
    "another job"); refused by the launcher table's check, exit 2, before either trains."""
    proc, out = torchrun_workers
    exits = [re.findall(rf"rank {rank}: --engine horovod exited (\S+)", proc.stdout) for rank in (0, 1)]
    assert exits == [["2"], ["2"]], proc.stdout + proc.stderr
    assert "error: --engine horovod joins its ranks through Horovod's rendezvous" in proc.stderr
    assert "which the 2 processes torchrun started do not have" in proc.stderr
    assert "launch --engine horovod with horovodrun, mpirun or srun --mpi=pmix" in proc.stderr
    assert not out.exists()


@pytest.mark.slow
def test_ddp_find_unused_parameters_lets_a_model_with_an_idle_parameter_train(torchrun_workers, cache_dir):
    program = [str(BIN / "python"), str(REPO / "tests" / "probes" / "ddp_unused_probe.py"), "false"]
    failing = run(probe_launch("torchrun", program), cache_dir, timeout=180)
    # DDP waits for the idle head's gradient and fails at the second step
    assert failing.returncode != 0 and "step 2 done" not in failing.stdout
    assert "find_unused_parameters" in failing.stdout + failing.stderr
    working, _ = torchrun_workers  # with it: torchrun_workers_probe.py
    assert_ok(working)
    assert working.stdout.count("step 2 done") == 2
