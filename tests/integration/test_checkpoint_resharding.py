"""A sharded checkpoint (fsdp's, zero1's: every rank wrote its own part) saved at 2 ranks continues at 3, where
every rank's part of each tensor differs from the saver's, to the uninterrupted run's parameters. The other world
sizes (1, 4) and engines: test_engine_equivalence's resumes, on its 2-rank runs (a global batch of 16 has no 3)."""

from __future__ import annotations

import json

import pytest
from support.checks import max_abs_diff
from support.jobs import assert_ok, read_results, run, torchrun

from horovod_train.gpucheck.checks import EQUIVALENCE_TOLERANCE as TOLERANCE
from horovod_train.gpucheck.steps import EQUIVALENCE_JOB as JOB

pytestmark = pytest.mark.slow

STEPS = int(JOB[JOB.index("--max_steps") + 1])
GLOBAL_BATCH = 12  # 2 x 6 and 3 x 4


@pytest.mark.parametrize("engine", ["fsdp", "zero1"])
def test_a_sharded_checkpoint_of_two_ranks_continues_at_three(engine, tmp_path, cache_dir):
    args = [*JOB, "--engine", engine, "--save_strategy", "steps", "--save_steps", str(STEPS // 2)]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    assert_ok(run(torchrun(2, *args, "--per_device_train_batch_size", str(GLOBAL_BATCH // 2), "--output_dir",
                           str(full)), cache_dir))  # fmt: skip
    checkpoint = full / f"checkpoint-{STEPS // 2}"
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert {"optimizer/.metadata", "optimizer/__0_0.distcp", "optimizer/__1_0.distcp"} <= set(manifest), manifest
    proc = run(torchrun(3, *args, "--per_device_train_batch_size", str(GLOBAL_BATCH // 3), "--output_dir",
                        str(resumed), "--resume_from_checkpoint", str(checkpoint)), cache_dir)  # fmt: skip
    assert_ok(proc)
    assert f"resumed from step {STEPS // 2}" in proc.stdout
    assert (read_results(resumed)["world_size"], read_results(resumed)["global_step"]) == (3, STEPS)
    difference = max_abs_diff(full, resumed)
    print(f"{engine} saved at 2 ranks, resumed at 3: max-abs parameter difference {difference:.3e}")
    assert difference <= TOLERANCE
    # The run at 3 wrote its own checkpoints sharded in 3.
    assert {f"__{rank}_0.distcp" for rank in range(3)} <= {p.name for p in (resumed / f"checkpoint-{STEPS}" /
                                                                            "optimizer").iterdir()}  # fmt: skip
