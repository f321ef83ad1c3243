"""Engine.broadcast_object for checkpoints of any size: a >2 GiB tensor from rank 0 reaches every rank exactly
under each real launcher, with one copy of the payload per rank; small payloads and errors still travel."""

from __future__ import annotations

import json
import queue
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import broadcast_probe
import pytest
import torch
from conftest import BIN, REPO, assert_ok, mpirun, run

from horovod_train.config import RunConfig, TrainingArguments
from horovod_train.engines import create_engine
from horovod_train.engines.payload import CHUNK_BYTES, broadcast_from_root
from horovod_train.errors import UsageError

PROBE = [str(BIN / "python"), str(REPO / "tests" / "broadcast_probe.py")]
LAUNCHERS = ["horovod-gloo", "horovod-mpi", "ddp"]
LARGE_GIB = 2.2  # over the 2 GiB where int32 sizes and counts overflow
GB = 10**9


def launch(name: str, gib: float, out) -> list[str]:
    args = [str(gib), str(out)]
    if name == "horovod-gloo":
        return [str(BIN / "horovodrun"), "-np", "2", "--gloo", *PROBE, "horovod", *args]
    if name == "horovod-mpi":
        cmd = mpirun(2)
        return [*cmd[: cmd.index(str(BIN / "python"))], *PROBE, "horovod", *args]
    return [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "--no-python", *PROBE, "ddp", *args]


def run_probe(name: str, gib: float, out, cache_dir) -> list[dict]:
    assert_ok(run(launch(name, gib, out), cache_dir, timeout=240))
    reports = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]
    for rank, report in enumerate(reports):
        assert (report["rank"], report["world_size"]) == (rank, 2)
        assert report["usage_error"] == ["UsageError", "no checkpoint", "start fresh"]
        assert all(report["checks"].values()), f"rank {rank}: {report['checks']}"
    return reports


@pytest.mark.slow
@pytest.mark.parametrize("name", LAUNCHERS)
def test_large_payload_one_copy_per_rank(name, tmp_path, cache_dir):
    reports = run_probe(name, LARGE_GIB, tmp_path, cache_dir)
    payload = int(LARGE_GIB * 2**30)
    for report in reports:
        assert report["big_bytes"] == payload // 4 * 4
        # one copy of the payload, plus the interpreter, torch and the launcher's libraries
        assert report["peak_rss"] < payload + 1.5 * GB, report
    assert sum(r["peak_rss"] for r in reports) < 8 * GB
    print(name, [(round(r["peak_rss"] / GB, 2), round(r["seconds"], 1)) for r in reports])


def threads_broadcast(objects: list, chunk_bytes: int) -> list:
    """payload.broadcast_from_root between threads standing for ranks, over an in-memory wire."""
    wires = [queue.Queue() for _ in objects[1:]]

    def broadcast_from(rank: int) -> Callable[[torch.Tensor], None]:
        def broadcast_(tensor: torch.Tensor) -> None:
            assert tensor.is_contiguous() and tensor.numel() * tensor.element_size() <= max(chunk_bytes, 8)
            if rank == 0:
                for wire in wires:
                    wire.put(tensor.clone())
            else:
                sent = wires[rank - 1].get(timeout=10)
                assert (sent.dtype, sent.shape) == (tensor.dtype, tensor.shape)
                tensor.copy_(sent)

        return broadcast_

    with ThreadPoolExecutor(len(objects)) as pool:
        futures = [
            pool.submit(broadcast_from_root, obj, broadcast_from(rank), rank == 0, chunk_bytes)
            for rank, obj in enumerate(objects)
        ]
        return [future.result(timeout=30) for future in futures]


@pytest.mark.parametrize("chunk_bytes", [7, CHUNK_BYTES])  # chunks that split elements; one chunk per tensor
def test_small_payload_between_ranks(chunk_bytes):
    sent = broadcast_probe.payload(gib=1e-6)
    received = threads_broadcast([sent, None, None], chunk_bytes)
    assert received[0] is sent
    for got in received[1:]:
        assert all(broadcast_probe.check(got).values()), broadcast_probe.check(got)
        assert got["shared"][0] is got["shared"][1]  # one tensor twice stays one tensor
        assert got["model"]["small"]["transposed"].is_contiguous()


def test_broadcast_usage_error():
    error = UsageError("checkpoint is corrupted", "resume from an earlier checkpoint")
    for got in threads_broadcast([error, None], CHUNK_BYTES):
        assert type(got) is UsageError and (got.problem, got.fix, str(got)) == (error.problem, error.fix, str(error))


def test_one_process_engine_returns_the_object():
    engine = create_engine(RunConfig(training=TrainingArguments(engine="single")))
    sent = {"tensor": torch.ones(3), "error": UsageError("a", "b")}
    assert engine.broadcast_object(sent) is sent
