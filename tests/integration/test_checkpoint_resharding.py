"""A sharded checkpoint (fsdp's, zero1's: every rank wrote its own part) saved at 2 ranks continues at 3, where
every rank's part of each tensor differs from the saver's, to the uninterrupted run's parameters. The other world
sizes (1, 4) and engines: test_engine_equivalence's resumes, on its 2-rank runs (a global batch of 16 has no 3).
Saved beside training (--save_async): the run at 3 writes its own so, the checkpoint is the synchronous one's, and a
rank killed in the middle of such a save leaves the previous one, which `auto` resumes to the uninterrupted run's
parameters."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from support.checks import max_abs_diff
from support.jobs import BIN, REPO, assert_ok, launch, read_results, run, torchrun

from horovod_train.gpucheck.checks import EQUIVALENCE_TOLERANCE as TOLERANCE
from horovod_train.gpucheck.steps import EQUIVALENCE_JOB as JOB
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory

pytestmark = pytest.mark.slow

STEPS = int(JOB[JOB.index("--max_steps") + 1])
GLOBAL_BATCH = 12  # 2 x 6 and 3 x 4
TWO_RANKS = ["--per_device_train_batch_size", str(GLOBAL_BATCH // 2)]
PROBE = REPO / "tests" / "probes" / "killed_save_probe.py"


def job(engine: str, save_steps: int) -> list[str]:
    return [*JOB, "--engine", engine, "--save_strategy", "steps", "--save_steps", str(save_steps)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache_dir) -> Callable[[str], Path]:
    """The 2-rank run of an engine (checkpoints saved at once, at STEPS // 2 and at the end), once per module."""
    done: dict[str, Path] = {}

    def of(engine: str) -> Path:
        if engine not in done:
            out = tmp_path_factory.mktemp(f"{engine}-uninterrupted")
            assert_ok(run(torchrun(2, *job(engine, STEPS // 2), *TWO_RANKS, "--output_dir", str(out)), cache_dir))
            done[engine] = out
        return done[engine]

    return of


@pytest.mark.parametrize("engine", ["fsdp", "zero1"])
def test_a_sharded_checkpoint_of_two_ranks_continues_at_three(engine, uninterrupted, tmp_path, cache_dir):
    full, resumed = uninterrupted(engine), tmp_path / "resumed"
    args = job(engine, STEPS // 2)
    checkpoint = full / f"checkpoint-{STEPS // 2}"
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert {"optimizer/.metadata", "optimizer/__0_0.distcp", "optimizer/__1_0.distcp"} <= set(manifest), manifest
    three = ["--per_device_train_batch_size", str(GLOBAL_BATCH // 3), "--save_async"]
    proc = run(torchrun(3, *args, *three, "--output_dir", str(resumed), "--resume_from_checkpoint", str(checkpoint)),
               cache_dir)  # fmt: skip
    assert_ok(proc)
    assert f"resumed from step {STEPS // 2}" in proc.stdout
    assert (read_results(resumed)["world_size"], read_results(resumed)["global_step"]) == (3, STEPS)
    difference = max_abs_diff(full, resumed)
    print(f"{engine} saved at 2 ranks, resumed at 3: max-abs parameter difference {difference:.3e}")
    assert difference <= TOLERANCE
    # The run at 3 wrote its own checkpoints sharded in 3, beside training (--save_async): complete, every rank's
    # files listed, the model the one the run ended with.
    last = resumed / f"checkpoint-{STEPS}"
    assert ckpt.verify_checkpoint(last)["global_step"] == STEPS
    assert {f"optimizer/__{rank}_0.distcp" for rank in range(3)} <= set(ckpt.manifest_files(last))
    assert max_abs_diff(last, resumed) == 0.0


def test_a_rank_killed_in_a_save_beside_training_leaves_the_previous_checkpoint_which_auto_resumes(
    uninterrupted, tmp_path, cache_dir
):
    """--save_async, fsdp at 2 ranks, checkpoints every STEPS // 4: checkpoint-STEPS//2 is the synchronous run's,
    and rank 1 dies (tests/probes/killed_save_probe.py) once it has written its part of the next one, while training
    goes on. The half-written one is not taken: `auto` resumes the previous, saving beside training again, and ends
    with the uninterrupted (synchronously saved) run's parameters."""
    full, out, every = uninterrupted("fsdp"), tmp_path / "run", STEPS // 4
    args = [*job("fsdp", every), *TWO_RANKS, "--save_async", "--output_dir", str(out)]
    killed = run(launch("torchrun", [str(BIN / "python"), str(PROBE), str(3 * every), *args]), cache_dir)
    assert killed.returncode != 0 and f"Signal {signal.SIGKILL.value}" in killed.stdout + killed.stderr, (
        f"exit {killed.returncode}: rank 1 was not killed in the save\n{killed.stdout[-2000:]}{killed.stderr[-2000:]}"
    )
    assert [p.name for p in RunDirectory(out).checkpoints()] == [f"checkpoint-{every}", f"checkpoint-{2 * every}"]
    (cut_off,) = out.glob(f".checkpoint-{3 * every}.*.tmp")
    assert (cut_off / "optimizer" / "__1_0.distcp").is_file() and not (cut_off / "manifest.json").exists()
    previous = out / f"checkpoint-{2 * every}"
    assert ckpt.verify_checkpoint(previous)["global_step"] == 2 * every
    # Saved beside training, the same tensors as the synchronous run's checkpoint of that step.
    assert max_abs_diff(previous, full / previous.name) == 0.0

    proc = run(torchrun(2, *args, "--resume_from_checkpoint", "auto"), cache_dir)
    assert_ok(proc)
    assert f"resumed from step {2 * every}" in proc.stdout, proc.stdout[-3000:]
    assert not list(out.glob(".checkpoint-*")), "what the killed write left was not cleaned up"
    assert read_results(out)["global_step"] == STEPS
    difference = max_abs_diff(full, out)
    print(f"fsdp, a rank killed in an asynchronous save, resumed: max-abs parameter difference {difference:.3e}")
    assert difference <= TOLERANCE
    # The resumed run's own checkpoints, saved beside training, are complete: every rank's files listed and valid.
    last = out / f"checkpoint-{STEPS}"
    assert ckpt.verify_checkpoint(last)["global_step"] == STEPS
    assert {"optimizer/__0_0.distcp", "optimizer/__1_0.distcp"} <= set(ckpt.manifest_files(last))
