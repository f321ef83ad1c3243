"""The sharded form of a checkpoint (engines/state_io.py) in one process: the model file every rank writes its rows
of, and `horovod-train checkpoint`, which turns a checkpoint into the other form and back. Multi-rank saves and
their resumes at other world sizes: tests/integration/test_checkpoint_resharding.py, test_engine_equivalence.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.checkpoints import JOB, trained  # noqa: F401 (a fixture)
from support.checks import max_abs_diff
from support.jobs import assert_ok, cli_here, train_here

from horovod_train.engines import state_io
from horovod_train.outputs import checkpoint as ckpt

pytestmark = pytest.mark.slow


def test_the_model_file_written_in_place_is_the_safetensors_file_of_the_tensors(tmp_path):
    """Rank 0's header and sizing, then each tensor's bytes at its offset: safetensors reads every dtype back."""
    tensors = {"b.weight": torch.randn(5, 3), "a.bias": torch.randn(7).to(torch.bfloat16), "scale": torch.tensor(2.5),
               "ids": torch.arange(6).reshape(2, 3), "mask": torch.tensor([True, False])}  # fmt: skip
    state_io.write_model_rows(tensors, tmp_path / "model.safetensors", is_main=True, barrier=lambda: None)
    loaded = load_file(tmp_path / "model.safetensors")
    assert loaded.keys() == tensors.keys()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in tensors.items())
    with state_io.ModelFile(tmp_path / "model.safetensors") as source:
        assert torch.equal(source.rows("b.weight", 1, 4), tensors["b.weight"][1:4])


def optimizer_state(checkpoint: Path) -> dict:
    return torch.load(checkpoint / ckpt.STATE_FILE, weights_only=True)["optimizer"]


def convert(source: Path, destination: Path, form: str):
    return cli_here(["checkpoint", str(source), str(destination), "--to", form], {})


def test_a_checkpoint_turned_sharded_resumes_the_same_and_turns_back_whole_unchanged(trained, tmp_path, cache_dir):  # noqa: F811
    source = trained / "checkpoint-3"
    before = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}
    sharded, whole = tmp_path / "sharded" / "checkpoint-3", tmp_path / "whole" / "checkpoint-3"
    assert_ok(convert(source, sharded, "sharded"))
    manifest = json.loads((sharded / ckpt.MANIFEST).read_text())
    assert {"optimizer/.metadata", "optimizer/__0_0.distcp", ckpt.MODEL_FILE} <= set(manifest)
    assert set(optimizer_state(sharded)) == {"param_groups", state_io.SHARDED}
    assert_ok(convert(sharded, whole, "whole"))
    original, back = optimizer_state(source), optimizer_state(whole)
    assert back["param_groups"] == original["param_groups"] and back["state"].keys() == original["state"].keys()
    for index, entry in original["state"].items():
        assert entry.keys() == back["state"][index].keys()
        assert all(torch.equal(value, back["state"][index][name]) for name, value in entry.items())
    assert before == {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}, "the source was changed"
    # The sharded form resumes (read whole by this one process) to where the whole one does.
    for name, checkpoint in (("from-whole", source), ("from-sharded", sharded)):
        assert_ok(train_here(cache_dir, *JOB, "--max_steps", "6", "--save_strategy", "no", "--output_dir",
                             str(tmp_path / name), "--resume_from_checkpoint", str(checkpoint)))  # fmt: skip
    assert max_abs_diff(tmp_path / "from-whole", tmp_path / "from-sharded") == 0.0


def test_a_conversion_onto_an_existing_directory_or_into_its_own_form_is_refused(trained, tmp_path):  # noqa: F811
    taken = tmp_path / "taken"
    taken.mkdir()
    for destination, form, expected in [(taken, "sharded", f"error: {taken} exists"),
                                        (tmp_path / "new", "whole", "is already whole")]:  # fmt: skip
        proc = convert(trained / "checkpoint-3", destination, form)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr
    assert list(taken.iterdir()) == [] and not (tmp_path / "new").exists()
