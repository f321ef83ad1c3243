"""The trainer's shape, kept: small classes, state set in one place, builders that only build, a loop that
imports no backend, one sharded loop behind evaluation and prediction."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from support.imports import imported_modules
from support.jobs import REPO

PACKAGE = REPO / "horovod_train"
TRAINING = sorted((PACKAGE / "training").glob("*.py"))


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def assigned_attributes(function: ast.FunctionDef) -> set[str]:
    """The ``self.<name>`` this method assigns (plain, augmented, annotated or unpacked)."""
    return {
        node.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name) and node.value.id == "self"
    }  # fmt: skip


def test_the_trainer_sets_its_attributes_in_init_and_setup_only():
    trainer = next(
        node for node in ast.walk(parse(PACKAGE / "training" / "trainer.py")) if isinstance(node, ast.ClassDef)
        and node.name == "Trainer"
    )  # fmt: skip
    methods = {node.name: node for node in trainer.body if isinstance(node, ast.FunctionDef)}
    elsewhere = {
        name: sorted(assigned_attributes(method))
        for name, method in methods.items()
        if name not in ("__init__", "setup") and assigned_attributes(method)
    }
    assert not elsewhere, f"attributes set outside __init__ and setup: {elsewhere}"
    declared = assigned_attributes(methods["__init__"])
    undeclared = assigned_attributes(methods["setup"]) - declared
    assert not undeclared, f"setup() creates attributes __init__ does not declare: {sorted(undeclared)}"


def test_the_builders_return_what_they_build_and_set_nothing():
    tree = parse(PACKAGE / "training" / "build.py")
    stores = [
        f"line {node.lineno}" for node in ast.walk(tree)
        if isinstance(node, ast.Attribute | ast.Subscript) and isinstance(node.ctx, ast.Store)
    ]  # fmt: skip
    assert not stores, f"a builder sets state: {stores}"
    assert not [node.name for node in tree.body if isinstance(node, ast.ClassDef)], "builders are functions"


@pytest.mark.parametrize("path", TRAINING, ids=lambda path: path.name)
def test_the_loop_and_its_parts_import_no_backend(path):
    """Engines wrap model, optimizer, sampler and collectives (elastic Horovod's state among them); the trainer's
    modules import none of them."""
    backends = ("horovod.", "torch.distributed", "torch.nn.parallel", "horovod_train.engines.")
    # specs: the engines' rows, whose reading imports no engine (the memory check asks a row's memory part).
    allowed = {"horovod_train.engines.base", "horovod_train.engines.policy", "horovod_train.engines.specs"}
    found = {name for name in imported_modules(path) if f"{name}.".startswith(backends)}
    found = {name for name in found if not f"{name}.".startswith(tuple(f"{module}." for module in allowed))}
    assert not found, found


class Echo(torch.nn.Module):
    """Logits that depend on the example: (input_ids' first token, its second)."""

    def forward(self, input_ids: torch.Tensor, **_: torch.Tensor):
        return type("Output", (), {"logits": input_ids[:, :2].float()})()


def test_evaluation_and_prediction_run_one_sharded_loop_with_the_same_predictions():
    from horovod_train.engines.single import SingleEngine
    from horovod_train.training.amp import Precision
    from horovod_train.training.evaluation import gather_outputs

    engine = SingleEngine.__new__(SingleEngine)
    rows = [{"input_ids": [i % 2, (i + 1) % 2, 5], "labels": i % 2, "example_index": i} for i in range(7)]
    loader = torch.utils.data.DataLoader(
        Dataset.from_list(rows).with_format("torch"), batch_size=3, collate_fn=torch.utils.data.default_collate
    )
    labelled, losses = gather_outputs(engine, Echo(), loader, Precision("fp32", engine.device), labelled=True)
    unlabelled, none = gather_outputs(engine, Echo(), loader, Precision("fp32", engine.device), labelled=False)
    assert none is None and torch.equal(labelled[:, :2], unlabelled)
    assert labelled.tolist() == [[i, (i + 1) % 2, i % 2] for i in range(7)]
    logits = torch.tensor([[i % 2, (i + 1) % 2] for i in range(7)], dtype=torch.float32)
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor([i % 2 for i in range(7)]), reduction="none")
    assert torch.allclose(losses, expected.double())
