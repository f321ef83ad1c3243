"""Engine.broadcast_object for checkpoints of any size: a >2 GiB tensor from rank 0 reaches every rank exactly
under each real launcher, with one copy of the payload per rank; small payloads and errors still travel."""

from __future__ import annotations

import json

import pytest
from support.jobs import BIN, REPO, assert_ok, probe_launch, run

from horovod_train.engines.joining import implied_engine
from horovod_train.launching import launcher

PROBE = [str(BIN / "python"), str(REPO / "tests" / "probes" / "broadcast_probe.py")]

LAUNCHERS = ["horovodrun", "mpirun", "torchrun"]

LARGE_GIB = 2.2  # over the 2 GiB where int32 sizes and counts overflow

GB = 10**9


def launch(name: str, gib: float, out) -> list[str]:
    return probe_launch(name, [*PROBE, implied_engine(launcher(name)), str(gib), str(out)])


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
