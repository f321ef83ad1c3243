"""The engine contract, checked over every engine under its real launcher: what the trainer relies on
(ranks, exact collectives, rank-0 broadcast, local-main-first, identical replicas after wrap and after a
step, the default policy) holds for each of them."""

from __future__ import annotations

import json

import pytest
from support.jobs import BIN, REPO, assert_ok, probe_launch, run

from horovod_train.engines import available_engines
from horovod_train.launching import LAUNCHERS

PROBE = [str(BIN / "python"), str(REPO / "tests" / "probes" / "engine_probe.py")]


def contract_launches() -> list[tuple[str, str]]:
    """(launcher, engine): every launcher that starts ranks here with the engine it implies, then every engine of
    the registry that none implies (dp) as one plain python process."""
    launches = [(row.name, row.engine) for row in LAUNCHERS.values() if row.local]
    implied = {engine for _, engine in launches}
    return [*launches, *(("plain", engine) for engine in available_engines() if engine not in implied)]


@pytest.mark.slow
@pytest.mark.parametrize(("launcher", "engine"), contract_launches())
def test_engine_contract(launcher, engine, tmp_path, cache_dir):
    world = 1 if LAUNCHERS[launcher].fallback else 2
    assert_ok(run(probe_launch(launcher, [*PROBE, engine, str(tmp_path)]), cache_dir, timeout=300))
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(world)]
    big = float(2**40)
    expected_gather = [[r, r] for r in range(world) for _ in range(r + 1)]
    for rank, report in enumerate(reports):
        assert (report["rank"], report["world_size"], report["is_main"]) == (rank, world, rank == 0)
        assert report["describe"]["engine"] == engine and report["describe"]["world_size"] == world
        assert report["sum"][0] == world * big + sum(range(1, world + 1))  # exact in float64
        assert report["sum"][1] == pytest.approx(0.1 * sum(range(1, world + 1)), abs=1e-15)
        assert report["gathered"] == expected_gather  # uneven lengths, rank order
        assert report["objects"] == [{"rank": r} for r in range(world)]
        assert report["broadcast"] == {"from": 0, "payload": [0, 1, 2, 3, 4]}
        assert len(set(report["checksums_after_wrap"])) == 1, "replicas differ after wrap"
        assert len(set(report["checksums_after_step"])) == 1, "replicas differ after a step"
        assert report["checksums_after_step"] != report["checksums_after_wrap"], "the step changed nothing"
        assert report["default_policy"] and not report["joins_running_job"]
    order = (tmp_path / "local_main_first.txt").read_text().split()
    assert order[0] == "0" and sorted(order) == sorted(str(r["local_rank"]) for r in reports)
