"""Checkpoints: exact resume mid-epoch, corruption and mismatch detection, atomic writes."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support.checkpoints import SAVED, resume
from support.checks import max_abs_diff
from support.jobs import SMALL_JOB, assert_ok, horovodrun, read_results, run, torchrun, train_here

from horovod_train.common.digest import sha256
from horovod_train.common.errors import UsageError
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory

pytestmark = pytest.mark.slow

JOB = [*SMALL_JOB, "--synthetic_num_examples", "600", "--dropout", "0", "--save_total_limit", "20"]


def train(engine: str, cache_dir: Path, *args: str, timeout: float = 300):
    """Two ranks under horovodrun or torchrun, or one process (single) in this one."""
    if engine == "horovod":
        return run(horovodrun(2, *args), cache_dir, timeout)
    if engine == "ddp":
        return run(torchrun(2, "--engine", "ddp", *args), cache_dir, timeout)
    return train_here(cache_dir, "--engine", "single", *args)


def crash_and_resume(
    engine: str, args: list[str], tmp_path: Path, cache_dir: Path, step: int, prepare=None, timeout: float = 300
) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """The uninterrupted run in ``full``; then a second run directory, ``resumed``, holding only what a crash after
    ``step`` would have left (``prepare`` applied to that checkpoint), resumed with `latest`. Returns both and the
    resume's output."""
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    assert_ok(train(engine, cache_dir, *args, "--output_dir", str(full)))
    state = json.loads((full / f"checkpoint-{step}" / ckpt.TRAINER_FILE).read_text())
    # Both jobs train on 540 examples (600, 10% held out): fewer seen means the resume point is mid-epoch.
    assert state["epoch"] == 0 and 0 < state["samples_in_epoch"] < 540, "the resume point must be mid-epoch"
    resumed.mkdir()
    shutil.copytree(full / f"checkpoint-{step}", resumed / f"checkpoint-{step}")
    if prepare is not None:
        prepare(resumed / f"checkpoint-{step}")
    proc = train(engine, cache_dir, *args, "--output_dir", str(resumed), "--resume_from_checkpoint", "latest",
                 timeout=timeout)  # fmt: skip
    assert_ok(proc)
    return full, resumed, proc


def check_the_same_parameters(engine: str, full: Path, resumed: Path, proc, step: int, tolerance: float = 1e-6) -> None:
    """The resumed run ends with the uninterrupted run's parameters."""
    assert f"resumed from step {step}" in proc.stdout
    diff = max_abs_diff(full, resumed)
    print(f"{engine}: max-abs parameter difference after resume = {diff:.3e}")
    assert diff <= tolerance, f"resumed run differs from the uninterrupted one by {diff:.3e}"


def without_timings(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k} for entry in history]


def test_resume_mid_epoch_ends_with_the_same_parameters(tmp_path, cache_dir):
    args = [*JOB, "--max_steps", "50", "--save_steps", "10"]
    check_the_same_parameters("single", *crash_and_resume("single", args, tmp_path, cache_dir, 20), 20)


BALLAST_BYTES = 2**31 + 2**27  # 2.125 GiB


def grow_past_2_gib(checkpoint: Path) -> None:
    """A synthetic entry in the checkpoint's training state, its manifest's digest rewritten: a payload over 2 GiB
    that a resume broadcasts (and then drops: the run's own checkpoints are written afresh)."""
    state_file = checkpoint / ckpt.STATE_FILE
    state = torch.load(state_file, weights_only=True)
    state["ballast"] = torch.arange(BALLAST_BYTES // 4, dtype=torch.int32)
    torch.save(state, state_file)
    del state
    manifest = json.loads((checkpoint / ckpt.MANIFEST).read_text())
    manifest[ckpt.STATE_FILE] = sha256(state_file)
    (checkpoint / ckpt.MANIFEST).write_text(json.dumps(manifest))


@pytest.fixture(scope="module", params=["horovod", "ddp"])
def resumed_two_ranks(request, tmp_path_factory, cache_dir) -> Iterator[tuple[str, Path, Path, Any]]:
    """One crash and resume per engine for two tests: two ranks train 30 steps with dropout on premises of varied
    length (ranks pad differently); what a crash after step 10 leaves, its checkpoint grown past 2 GiB, is resumed
    with `latest`. The engine, the uninterrupted and the resumed run directories, and the resume's output."""
    import pandas as pd

    from horovod_train.data import synthetic

    engine, tmp_path = request.param, tmp_path_factory.mktemp(f"resumed-{request.param}")
    frame = pd.DataFrame(synthetic.generate(600, seed=42))  # premises of varying length: ranks pad differently
    frame["premise"] = [f"{p} {' '.join(['indeed'] * (i % 9))}" for i, p in enumerate(frame["premise"])]
    data = tmp_path / "varied.csv"
    frame.to_csv(data, index=False)
    args = [*SMALL_JOB, "--train_file", str(data), "--dropout", "0.1", "--max_steps", "30", "--save_steps", "5"]
    args += ["--save_total_limit", "20", "--audit_samples"]
    full, resumed, proc = crash_and_resume(engine, args, tmp_path, cache_dir, 10, grow_past_2_gib, timeout=600)
    yield engine, full, resumed, proc
    shutil.rmtree(resumed / "checkpoint-10", ignore_errors=True)  # 2 GiB


def test_two_ranks_resume_mid_epoch_with_dropout_and_every_ranks_generators(resumed_two_ranks):
    """With dropout each rank draws its own masks (its batches are padded to other lengths): every rank's
    RNG states are saved and each rank gets its own back, so the run resumed mid-epoch repeats the masks
    exactly (max-abs 0.0), and the per-epoch history (metrics, the sample audit) is the uninterrupted run's: Horovod's
    and DDP's case of test_resume_property.py::test_two_ranks_resume_exactly_from_a_checkpoint_of_any_step."""
    engine, full, resumed, proc = resumed_two_ranks
    check_the_same_parameters(engine, full, resumed, proc, 10, tolerance=0.0)
    rng = torch.load(full / "checkpoint-10" / ckpt.STATE_FILE, weights_only=True)["rng"]
    assert len(rng) == 2 and rng[0]["torch"] != rng[1]["torch"], "the ranks' generators should have diverged"
    history = read_results(full)["history"]
    assert without_timings(read_results(resumed)["history"]) == without_timings(history)
    # 540 training examples, 270 a rank: the first epoch (steps 1-17, the resume at 10) trains on each once.
    assert history[0]["samples"] == {"dataset": 540, "trained_on": 540, "skipped": 0, "repeated": 0}, history


def test_resume_of_a_checkpoint_over_2_gib(resumed_two_ranks):
    """Resume payloads over 2 GiB used to crash (hvd.broadcast_object's int32 size) or be copied once per
    rank (an all-gather). Two ranks resume a checkpoint grown past 2 GiB (resumed_two_ranks), and each rank holds
    about one copy of it."""
    engine, _, resumed, proc = resumed_two_ranks
    assert "resumed from step 10" in proc.stdout
    results = read_results(resumed)
    assert results["global_step"] == 30 and len(set(results["param_checksum_per_rank"])) == 1
    peaks = results["peak_memory_mb_per_rank"]
    print(f"{engine}: resumed a {BALLAST_BYTES / 2**30:.2f} GiB payload; peak RSS per rank {peaks} MiB")
    assert max(peaks) < (BALLAST_BYTES + 1.5 * 2**30) / 2**20, "more than one copy of the payload on a rank"


def test_checkpoints_are_pruned_and_verified(tmp_path, cache_dir):
    out = tmp_path / "run"
    args = [
        *SMALL_JOB,
        "--synthetic_num_examples",
        "600",
        "--max_steps",
        "12",
        "--save_steps",
        "4",
        "--save_total_limit",
        "2",
    ]
    assert_ok(train_here(cache_dir, "--engine", "single", *args, "--output_dir", str(out)))
    assert [p.name for p in RunDirectory(out).checkpoints()] == ["checkpoint-8", "checkpoint-12"]
    assert not list(out.glob(".checkpoint-*")), "no temporary checkpoint directory may be left behind"
    state = ckpt.verify_checkpoint(out / "checkpoint-12")
    assert state["global_step"] == 12
    tensors, training_state, _ = ckpt.load_checkpoint(out / "checkpoint-12")
    assert set(training_state) >= {"optimizer", "scheduler", "rng"}
    assert all(isinstance(t, torch.Tensor) for t in tensors.values())


def damage_file(path: Path, damage: str) -> None:
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[-10] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupted_checkpoint_is_refused(tmp_path, cache_dir, trained, damage):
    source = tmp_path / "source"
    shutil.copytree(trained, source)
    damage_file(source / "checkpoint-6" / ckpt.MODEL_FILE, damage)
    named = str(tmp_path / "resume" / "checkpoint-6")
    proc, untouched = resume(tmp_path, cache_dir, source, "--resume_from_checkpoint", named)
    assert proc.returncode == 2 and "corrupted" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and untouched


def test_latest_passes_over_a_corrupted_newest_checkpoint_with_a_warning(tmp_path, cache_dir, trained):
    source = tmp_path / "source"
    shutil.copytree(trained, source)
    damage_file(source / "checkpoint-6" / ckpt.MODEL_FILE, "flip")
    proc, _ = resume(tmp_path, cache_dir, source, "--resume_from_checkpoint", "latest")
    assert_ok(proc)
    assert "warning: passing over checkpoint" in proc.stderr and "checkpoint-6 is corrupted" in proc.stderr
    assert "resumed from step 3" in proc.stdout


def test_latest_with_no_valid_checkpoint_is_refused(tmp_path, cache_dir, trained):
    source = tmp_path / "source"
    shutil.copytree(trained, source)
    for step in (3, 6):
        damage_file(source / f"checkpoint-{step}" / ckpt.MODEL_FILE, "truncate")
    proc, untouched = resume(tmp_path, cache_dir, source, "--resume_from_checkpoint", "latest")
    assert proc.returncode == 2 and untouched
    assert "error: --resume_from_checkpoint latest: no valid checkpoint" in proc.stderr, proc.stderr


def test_incomplete_checkpoint_is_refused(tmp_path, cache_dir, trained):
    source = tmp_path / "source"
    shutil.copytree(trained, source)
    (source / "checkpoint-6" / ckpt.MANIFEST).unlink()
    own = tmp_path / "resume" / "checkpoint-6"  # resume() resumes in a copy of source
    proc, untouched = resume(tmp_path, cache_dir, source, "--resume_from_checkpoint", str(own))
    assert proc.returncode == 2 and "manifest.json" in proc.stderr and untouched


def test_checkpoint_of_another_label_count_is_refused(tmp_path, cache_dir, trained):
    import pandas as pd

    from horovod_train.data import synthetic

    frame = pd.DataFrame(synthetic.generate(600, seed=42))
    frame["label"] = frame["label"].clip(upper=1)
    data = tmp_path / "two_labels.csv"
    frame.to_csv(data, index=False)
    proc, untouched = resume(
        tmp_path,
        cache_dir,
        trained,
        "--resume_from_checkpoint",
        "latest",
        "--train_file",
        str(data),
        "--num_labels",
        "2",
    )
    assert proc.returncode == 2 and "num_labels=3" in proc.stderr and "num_labels=2" in proc.stderr, proc.stderr
    assert untouched


def test_missing_checkpoint_path_is_refused(tmp_path, cache_dir, trained):
    proc, untouched = resume(tmp_path, cache_dir, trained, "--resume_from_checkpoint", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr and untouched


@pytest.mark.parametrize(
    ("changed", "fix"),
    [
        ({"tokenizer": "t2"}, "the tokenizer the checkpoint was trained with"),
        ({"label_names": ["a", "b", "c"]}, "the same labels"),
        ({"train_data": "d2"}, "the same training data"),
        ({"seed": 7}, "--seed"),
        ({"group_by_length": True}, "--group_by_length"),
        ({"global_batch": 64}, "global batch"),
    ],
)
def test_a_checkpoint_of_other_data_order_or_tokenizer_is_refused(changed, fix):
    run = dataclasses.replace(SAVED, **changed)
    name, value = next(iter(changed.items()))
    with pytest.raises(UsageError) as refused:
        run.check(dataclasses.asdict(SAVED), Path("out/checkpoint-6"))
    line = str(refused.value)
    assert f"saved with {name}={getattr(SAVED, name)!r} but this run has {name}={value!r}" in line
    assert fix in refused.value.fix and "\n" not in line


def test_a_checkpoint_without_the_data_fields_resumes_with_a_warning(tmp_path, cache_dir, trained):
    """Checkpoints written before the data checks are loadable: one warning line names what is not checked."""
    source = tmp_path / "source"
    shutil.copytree(trained, source)
    checkpoint = source / "checkpoint-6"
    state = json.loads((checkpoint / ckpt.TRAINER_FILE).read_text())
    added = ckpt.Compatibility.ADDED_LATER
    state["compatibility"] = {k: v for k, v in state["compatibility"].items() if k not in added}
    (checkpoint / ckpt.TRAINER_FILE).write_text(json.dumps(state))
    manifest = json.loads((checkpoint / ckpt.MANIFEST).read_text())
    manifest[ckpt.TRAINER_FILE] = sha256(checkpoint / ckpt.TRAINER_FILE)
    (checkpoint / ckpt.MANIFEST).write_text(json.dumps(manifest))
    proc, _ = resume(tmp_path, cache_dir, source, "--resume_from_checkpoint", "latest")
    assert_ok(proc)
    assert "resumed from step 6" in proc.stdout
    assert "predates the checks of tokenizer, label_names, train_data, seed, group_by_length" in proc.stderr


def test_group_by_length_resumes_on_another_split_of_the_global_batch(tmp_path, cache_dir):
    """A grouped run of 2 ranks x 8 resumed on 1 rank x 8 x accumulation 2 (global batch 16 both): the epoch
    trains on every example once, as an uninterrupted run does (the grouping used to follow the per-device
    batch x ranks, 16 against 8, and the resumed epoch repeated and skipped examples)."""
    # 270 examples: 17 steps, the last batches partial
    args = [*JOB, "--synthetic_num_examples", "300", "--group_by_length", "--audit_samples"]
    args += ["--per_device_train_batch_size", "8"]
    full, out = tmp_path / "full", tmp_path / "resumed"
    assert_ok(run(horovodrun(2, *args, "--save_steps", "5", "--output_dir", str(full)), cache_dir))
    assert read_results(full)["history"][0]["samples"]["skipped"] == 0
    out.mkdir()
    shutil.copytree(full / "checkpoint-5", out / "checkpoint-5")  # what a crash after step 5 leaves
    resumed = train("single", cache_dir, *args, "--gradient_accumulation_steps", "2", "--output_dir", str(out),
                    "--resume_from_checkpoint", "auto")  # fmt: skip
    assert_ok(resumed)
    assert "resumed from step 5" in resumed.stdout
    (epoch,) = read_results(out)["history"]
    assert epoch["samples"] == {"dataset": 270, "trained_on": 270, "skipped": 0, "repeated": 0}, epoch
