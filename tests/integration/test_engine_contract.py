"""The engine contract, checked over every engine under its real launcher: what the trainer relies on
(ranks, exact collectives, rank-0 broadcast, local-main-first, identical replicas after wrap and after a
step, the default policy, the model's and the optimizer's whole state gathered on rank 0 and loaded back,
evaluation in step over uneven shards) holds for each of them. The engines of one plain python process (the
fallback launcher) are probed in this one, which is such a process: their contract is not about processes."""

from __future__ import annotations

import json

import pytest
from probes import engine_probe
from support.jobs import BIN, REPO, assert_ok, probe_launch, run

from horovod_train.engines.joining import implied_engine
from horovod_train.engines.specs import ENGINES
from horovod_train.launching import LAUNCHERS

PROBE = [str(BIN / "python"), str(REPO / "tests" / "probes" / "engine_probe.py")]


def contract_launches() -> list[tuple[str, str]]:
    """(launcher, engine): every launcher that starts ranks here with the engine it implies, then every engine of
    the registry that none implies under the launcher it names for this machine (zero1 and fsdp under torchrun, dp
    as one plain python process)."""
    launches = [(row.name, implied_engine(row)) for row in LAUNCHERS.values() if row.local]
    implied = {engine for _, engine in launches}
    return [*launches, *((spec.launcher, name) for name, spec in ENGINES.items() if name not in implied)]


@pytest.mark.slow
@pytest.mark.parametrize(("launcher", "engine"), contract_launches())
def test_engine_contract(launcher, engine, tmp_path, cache_dir):
    world = 1 if LAUNCHERS[launcher].fallback else 2
    if world == 1:  # no start-up to pay: 6-7 CPU-seconds of imports
        engine_probe.main(engine, tmp_path)
    else:
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
        # The model's whole state (gathered where sharded) and the optimizer's in torch's format, on rank 0.
        state = report["state"]
        assert state["reloaded_checksum"] == state["parameter_checksum"] == report["checksums_after_step"][0]
        assert state["zeroed_checksum"] != state["parameter_checksum"]
        assert report["evaluated_unevenly"]
        # No gradient leaves a rank on an accumulation micro-step; FSDP reduce-scatters after the last one.
        assert report["reduce_scatters"][0] == 0, "a reduce-scatter on an accumulation micro-step"
        assert report["reduce_scatters"][1] > 0 or engine != "fsdp", "FSDP's gradient was never reduce-scattered"
    main = reports[0]["state"]
    assert main["whole_model_checksum"] == main["parameter_checksum"]
    assert main["optimizer_indices"] == list(range(len(reports[0]["parameter_shapes"])))
    assert main["optimizer_shapes"] == reports[0]["parameter_shapes"], "the optimizer's state is not whole"
    assert main["reloaded_optimizer_digest"] == main["optimizer_digest"]
    order = (tmp_path / "local_main_first.txt").read_text().split()
    assert order[0] == "0" and sorted(order) == sorted(str(r["local_rank"]) for r in reports)
