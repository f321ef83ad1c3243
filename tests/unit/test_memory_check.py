"""The memory check before start (the engines' memory model): its activation term against `bench memory`'s
in-process measurement, and the 0.80 B decoder that zero1 could not hold (docs/performance.md), in-process."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, LlamaConfig

from horovod_train.bench import architectures
from horovod_train.bench.runs import memory
from horovod_train.common.errors import UsageError
from horovod_train.engines.specs import ENGINES
from horovod_train.training import peak_memory

SHAPES = {
    "bert": BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=512, num_labels=3),  # eager attention: its scores are saved
    "llama": LlamaConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, intermediate_size=344, num_labels=3, pad_token_id=0),  # sdpa
}  # fmt: skip
FACTOR = 2.5  # the estimate is an upper bound of the measurement, and at most this many times it


@pytest.mark.parametrize("seq", [64, 256])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_activation_estimate_bounds_bench_memorys_measurement(name, seq):
    config, batch = SHAPES[name], 2
    measured = memory.measure_activations(config, seq, "full", batch=batch)
    saved = batch * (config.num_hidden_layers * measured.layer + measured.rest)
    estimate = peak_memory.activation_bytes(config, batch, seq, gradient_checkpointing=False)
    assert saved <= estimate <= FACTOR * saved, (estimate, saved)
    # Checkpointing keeps a layer's input alone, and recomputes one layer whole: less, yet more than one layer.
    checkpointed = peak_memory.activation_bytes(config, batch, seq, gradient_checkpointing=True)
    assert batch * measured.layer < checkpointed < estimate


def decoder_0_8b_parts(engine: str, ranks: int) -> tuple[int, dict[str, float]]:
    """Rank 0's peak for the 0.80 B decoder (decoder-0.5b's shape with 38 layers), batch 2 x 128, as measured."""
    config = LlamaConfig(num_labels=3, pad_token_id=0, **{**architectures.DECODER_0_5B, "num_hidden_layers": 38})
    params, _ = memory.count(config, "full")
    activations = peak_memory.activation_bytes(config, 2, 128, gradient_checkpointing=False)
    largest = max(t.numel() for t in memory.build_on_meta(config, "full").state_dict().values())
    return params, ENGINES[engine].memory.peak_bytes(params, params, ranks, activations, largest=largest)


def test_the_0_8b_decoder_that_zero1_could_not_hold_is_refused_in_one_line(monkeypatch):
    """With the 22.2 GiB that was free when zero1 was OOM-killed at np=2 (and fsdp trained at 8.6 GiB a rank),
    ddp and zero1 are refused in one line naming the parts and the fixes; fsdp is not."""
    monkeypatch.setattr(peak_memory, "memory_available", lambda device=None: 22.2 * peak_memory.GIB)
    cpu = torch.device("cpu")
    for engine in ("ddp", "zero1"):
        params, parts = decoder_0_8b_parts(engine, 2)
        with pytest.raises(UsageError) as refused:
            peak_memory.check_peak_fits(engine, params, parts, 2, cpu)
        line = str(refused.value)
        assert "\n" not in line and "activations" in line and "base" in line and "--engine fsdp" in line, line
    params, parts = decoder_0_8b_parts("fsdp", 2)
    peak_memory.check_peak_fits("fsdp", params, parts, 2, cpu)
    assert sum(parts.values()) >= 8632 * 2**20  # fsdp's measured peak a rank is within its estimate


def test_fsdps_final_output_gathers_one_tensor_on_every_rank():
    """engines/pretrained.py: the largest tensor of the 0.80 B decoder (an MLP weight, 5504 x 1024 fp32: 21.5 MiB)
    on each rank, where rank 0 once gathered the other rank's half of the weights (4P(W-1)/W: 1.5 GiB)."""
    _, parts = decoder_0_8b_parts("fsdp", 2)
    assert parts["save gather"] == 4 * 5504 * 1024
    assert peak_memory.node_bytes(parts, 2) == 2 * sum(parts.values())


def test_a_save_beside_training_counts_each_ranks_copy_of_its_part(monkeypatch):
    """--save_async: at a save each fsdp rank copies its shard of the fp32 weights and AdamW's moments and holds it
    until its write ends (measured on the 0.25 B decoder at np=2: rank 0's peak RSS 3246 MiB saved at once, 4904 MiB
    with --save_async; docs/performance.md), a zero1 rank its moments, a replicated engine nothing (it saves at once).
    A run that fits only without the copy is refused, naming it."""
    config = LlamaConfig(num_labels=3, pad_token_id=0, **{**architectures.DECODER_0_5B, "num_hidden_layers": 12})
    params, _ = memory.count(config, "full")
    fsdp = ENGINES["fsdp"].memory
    at_once, beside = (fsdp.peak_bytes(params, params, 2, 0.0, save_async=s) for s in (False, True))
    copy = beside["save copy"]
    assert at_once["save copy"] == 0 and copy == (4 + 8) * params / 2
    assert 0.8 * (4904 - 3246) * 2**20 <= copy <= (4904 - 3246) * 2**20
    assert ENGINES["zero1"].memory.peak_bytes(params, params, 2, 0.0, save_async=True)["save copy"] == 8 * params / 2
    assert ENGINES["ddp"].memory.peak_bytes(params, params, 2, 0.0, save_async=True)["save copy"] == 0
    free = peak_memory.node_bytes(at_once, 2) + copy  # room for one rank's copy, not both
    monkeypatch.setattr(peak_memory, "memory_available", lambda device=None: free)
    cpu = torch.device("cpu")
    peak_memory.check_peak_fits("fsdp", params, at_once, 2, cpu)
    with pytest.raises(UsageError, match="save copy 1.4"):
        peak_memory.check_peak_fits("fsdp", params, beside, 2, cpu)


def test_the_check_before_start_counts_the_copy_only_with_save_async(monkeypatch):
    """train's check (build.check_memory) passes --save_async to the engine's row's memory part:
    the 0.25 B decoder under fsdp at np=2 fits the memory free between its two peaks without the option and is
    refused with it."""
    from types import SimpleNamespace

    from horovod_train.config.parsing import parse_run_config
    from horovod_train.training import build

    config = LlamaConfig(num_labels=3, pad_token_id=0, **{**architectures.DECODER_0_5B, "num_hidden_layers": 12})
    monkeypatch.setattr(build, "build_model", lambda *args, **kwargs: memory.build_on_meta(config, "full"))
    params, _ = memory.count(config, "full")
    cpu = torch.device("cpu")
    fsdp = ENGINES["fsdp"].memory
    engine = SimpleNamespace(name="fsdp", world_size=2, local_world_size=2, replicate_degree=1, device=cpu)
    flags = ["--per_device_train_batch_size", "2", "--max_seq_length", "128"]
    activations = peak_memory.activation_bytes(config, 2, 128, gradient_checkpointing=False)
    largest = max(t.numel() for t in memory.build_on_meta(config, "full").state_dict().values())
    at_once = fsdp.peak_bytes(params, params, 2, activations, largest=largest)
    free = peak_memory.node_bytes(at_once, 2) + (4 + 8) * params / 2  # room for one rank's copy, not both
    monkeypatch.setattr(peak_memory, "memory_available", lambda device=None: free)
    build.check_memory(parse_run_config(flags), engine, None, None)
    with pytest.raises(UsageError, match="save copy"):
        build.check_memory(parse_run_config([*flags, "--save_async"]), engine, None, None)
