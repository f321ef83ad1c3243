"""bench memory's formula (fit.py), its activation and all-reduce counts, and bench project's LoRA column:
in-process, on tiny or meta-device models, no speed asserted."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from horovod_train.bench import architectures
from horovod_train.bench.models import fit
from horovod_train.bench.runs import memory
from horovod_train.cli.main import main
from horovod_train.launching import compare

MODEL = fit.Model("toy", params=10**9, hidden=1000, layers=10, trainable_lora=10**6, largest=10**8)
ACT = fit.Activations(seq=100, hidden=1000, layer=4e6, rest=1e6)


def test_peak_bytes_matches_a_hand_worked_case():
    """1e9 parameters (1e6 trainable with LoRA), 10 layers of width 1000, 4 MB saved per layer and 1 MB outside
    them per sequence of 100 tokens, 2 sequences, 2 GB reserve, Horovod's 128 MiB fusion buffer:
    full = 16e9 + 134217728 + 2 x (10 x 4e6 + 1e6) + 2e9;
    gc keeps each layer's input (100 x 1000 x 4 = 4e5 bytes) and recomputes one layer: 2 x (4e6 + 4e6 + 1e6);
    LoRA with bf16 frozen weights and checkpointing on DataParallel's GPU 0: (1e9 - 1e6) x 2 + 1e6 x 16 state,
    1e6 x 4 for the summed replica gradients."""
    assert fit.peak_bytes(MODEL, "full", "horovod", 2, ACT) == 16e9 + 134217728 + 82e6 + 2e9
    assert fit.peak_bytes(MODEL, "gc", "ddp", 2, ACT) == 16e9 + 18e6 + 2e9
    assert fit.peak_bytes(MODEL, "lora-bf16+gc", "dp", 2, ACT) == 1.998e9 + 16e6 + 4e6 + 18e6 + 2e9
    assert fit.peak_bytes(MODEL, "lora", "horovod", 2, ACT) == 3.996e9 + 16e6 + 4e6 + 82e6 + 2e9  # buffer <= grads


def test_activations_scale_with_the_hidden_size():
    """Twice as wide: twice the bytes per layer and outside them (fixed head size and MLP ratio)."""
    wide = fit.Model("wide", params=4 * 10**9, hidden=2000, layers=10, trainable_lora=10**6)
    assert fit.activation_bytes(wide, "full", 1, ACT) == 10 * 8e6 + 2e6


def test_the_largest_fitting_model_is_chosen_per_mode():
    small = fit.Model("small", 10**9, 1000, 10, 10**6)  # full: ~18.1 GB; LoRA: ~6.1 GB
    large = fit.Model("large", 5 * 10**9, 1000, 10, 10**6)  # full: ~82 GB; LoRA: ~22.1 GB
    rows = fit.fit_rows([small, large], {("full", 100): ACT, ("lora", 100): ACT}, batch=2, gpu_bytes=80e9)
    chosen = {(r["engine"], r["mode"]): r["largest"] for r in rows}
    assert chosen[("horovod", "full")] == "small" and chosen[("horovod", "lora")] == "large"
    assert {r["largest"] for r in fit.fit_rows([large], {("full", 100): ACT, ("lora", 100): ACT}, 2, 1e9)} == {"none"}


def test_saved_bytes_counts_activations_once_and_weights_never():
    """Linear(10, 20) saves its input (3 x 10 floats) and its weight; ReLU its output (3 x 20 floats)."""
    layer = nn.Sequential(nn.Linear(10, 20), nn.ReLU())
    x = torch.randn(3, 10, requires_grad=True)
    assert fit.saved_bytes(lambda: layer(x).sum(), exclude=layer.parameters()) == (30 + 60) * 4
    assert fit.saved_bytes(lambda: layer(x).sum()) == (30 + 60 + 200) * 4


def test_lora_all_reduces_the_adapters_and_the_head_alone():
    """tiny-bert (width 128, 2 layers, 3 labels), r=8 on query and value: 2 layers x 2 modules x (8x128 + 128x8)
    adapter weights + the classifier's 128x3 + 3 = 8579 float32 gradients; full fine-tuning all of them."""
    config = architectures.bert_config("tiny-bert")
    params, grads = memory.count(config, "lora", lora_r=8)
    assert sum(grads) == 8579 * 4
    full_params, full_grads = memory.count(config, "full")
    assert params - 8579 == full_params and sum(full_grads) == full_params * 4


def test_a_mode_not_run_is_computed_from_a_measured_one_and_marked():
    """full from gc: + the activations checkpointing drops, per rank: 2 x ((10 - 1) x 4e6 - 10 x 4e5) bytes."""
    reference = {"mode": "gc", "peak_rss_mib_per_rank": [1000, 1100]}
    row = memory.computed_row(MODEL, "full", compare.Run("ddp-gloo", "ddp", "torchrun", 2), 2, ACT, reference)
    extra = 2 * (9 * 4e6 - 10 * 4e5) / 2**20
    assert row["peak_rss_mib_per_rank"] == [round(1000 + extra), round(1100 + extra)]
    assert row["allreduce_bytes"] == 4 * 10**9 and row["status"].startswith("computed from gc")


def test_each_engine_decides_what_a_rank_holds_and_so_what_runs(monkeypatch):
    """1e9 parameters at 2 ranks: ddp 16 GB per rank, zero1 4 + 4 + 8/2 = 12 GB, fsdp 16/2 = 8 GB (and its "zero2"
    variant the same); with 26 GB free, a 2 GB margin and the memory check's peak (a 1 GiB base a rank, a save's
    gather: none for zero1, whose checkpoints are sharded; fsdp's final output, its largest tensor whole on each
    rank, 0.4 GB), fsdp runs (2 x 9.47 + 2 = 20.9) and ddp and zero1 are not run (2 x 17.07 + 2 = 36.1,
    2 x 13.07 + 2 = 28.1: zero1 ran when the guard counted the state alone, 2 x 12 + 1.5)."""
    runs = {name: compare.Run(name, engine, "torchrun", 2) for name, engine in
            [("ddp", "ddp"), ("zero1", "zero1"), ("fsdp", "fsdp"), ("fsdp-zero2", "fsdp")]}  # fmt: skip
    per_rank = {name: memory.state_bytes(MODEL, "full", run) for name, run in runs.items()}
    assert per_rank == {"ddp": 16e9, "zero1": 12e9, "fsdp": 8e9, "fsdp-zero2": 8e9}
    monkeypatch.setattr(memory, "memory_available", lambda: 26e9)
    fits = [name for name, run in runs.items() if memory.runnable(MODEL, "full", run, margin_gb=2.0)]
    assert fits == ["fsdp", "fsdp-zero2"]


def test_measured_activations_are_per_sequence_and_exceed_a_layers_input():
    """A layer saves more than its input (what checkpointing keeps), and the same bytes per sequence at any batch."""
    config = architectures.bert_config("tiny-bert")
    for kind in ("full", "lora"):
        one, three = (memory.measure_activations(config, 32, kind, lora_r=4, batch=b) for b in (1, 3))
        assert one.layer > 32 * 128 * 4 and one.layer == pytest.approx(three.layer, rel=1e-3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max_steps", "1"], "--max_steps must be >= 2"),
        (["--batch_sizes", "8"], "one size >= 1 per architecture"),
        (["--activation_seqs", "1024"], "out of 1..512"),
        (["--engines", "dp"], "one process per rank: not dp"),
    ],
)
def test_bench_memory_bad_input_is_one_line(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "memory", *args, "--output_dir", str(tmp_path / "never")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "never").exists()


def test_project_prints_lora_next_to_full_fine_tuning(tmp_path, capsys):
    out = tmp_path / "project"
    args = ["bench", "project", "--model", "tiny-bert", "--compute_ms", "100", "--max_gpus", "64", "--lora_r", "8"]
    assert main([*args, "--output_dir", str(out)]) == 0
    assert "Full fine-tuning vs LoRA r=8" in capsys.readouterr().out
    rows = json.loads((out / "project.json").read_text())["rows"]
    full = {(r["setting"], r["world_size"]): r for r in rows if not r["setting"].endswith("-lora")}
    lora = {(r["setting"].removesuffix("-lora"), r["world_size"]): r for r in rows if r["setting"].endswith("-lora")}
    assert full.keys() == lora.keys() and {r["gradient_bytes"] for r in lora.values()} == {8579 * 4}
    assert all(lora[k]["compute_ms"] == pytest.approx(100 * (1 - 1 / 3)) for k in lora)  # no weight gradients
