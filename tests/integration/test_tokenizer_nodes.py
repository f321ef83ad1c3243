"""Two nodes with node-local caches train on one tokenizer. The tokenizers library breaks ties between
equally frequent merges in hash order, so a tiny-bert tokenizer trained twice on the same texts differs (7 of
8 trainings here); each node's local rank 0 used to train its own, and the ranks of the two nodes trained on
different token ids. Rank 0's tokenizer is now every node's: two torchrun agents on this machine stand for the
nodes, each with its own HOROVOD_TRAIN_CACHE."""

from __future__ import annotations

import subprocess

from support.jobs import REPO, SMALL_JOB, base_env, read_results
from support.launch import free_port

from horovod_train.launching import LAUNCHERS


def test_nodes_with_their_own_caches_train_on_rank_0s_tokenizer(tmp_path, cache_dir):
    out, port = tmp_path / "out", free_port()
    args = [*SMALL_JOB, "--engine", "ddp", "--max_steps", "6", "--output_dir", str(out)]
    program = ["-m", "horovod_train", "train", *args]
    torchrun = LAUNCHERS["torchrun"]
    cmd = torchrun.command(program, 1, nnodes=2, rdzv_endpoint=f"127.0.0.1:{port}", executable=torchrun.find_tool())
    caches = [tmp_path / "node0-cache", tmp_path / "node1-cache"]
    envs = [{**base_env(cache_dir), "HOROVOD_TRAIN_CACHE": str(cache)} for cache in caches]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    nodes = [subprocess.Popen(cmd, cwd=REPO, env=env, **pipes) for env in envs]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert read_results(out)["world_size"] == 2
    tokenizers = [sorted((cache / "tokenizers").glob("tiny-bert-*/tokenizer.json")) for cache in caches]
    assert all(len(found) == 1 for found in tokenizers), tokenizers
    assert tokenizers[0][0].read_bytes() == tokenizers[1][0].read_bytes(), "the nodes trained two tokenizers"
