"""Peak memory of this process, the same way for every engine; the memory a run needs at its peak."""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Any

import torch

from horovod_train.common.errors import UsageError

GIB = 2**30


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated on ``device``, or the process's peak resident set size on CPU (MiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max_rss / 2**20 if sys.platform == "darwin" else max_rss / 2**10  # bytes on macOS, KiB on Linux


def memory_available(device: torch.device | None = None) -> int:
    """Bytes free for a run now: the machine's MemAvailable (/proc/meminfo: what other processes leave), or on a GPU
    the device's free memory."""
    if device is not None and device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


# The process itself before any model: Python, torch, transformers, datasets, the process group and the tokenized
# data (measured: 0.57 GB RSS after the imports alone, about 1 GB a training rank; docs/performance.md).
BASE_BYTES = 1 * GIB
# Bytes autograd saves per token per layer, in fp32 units of 4 bytes: FP32_PER_HIDDEN x hidden (the norms', q/k/v's,
# the residuals' inputs, dropout's masks), FP32_PER_INTERMEDIATE x intermediate (the MLP's up/gate/activation), and
# FP32_PER_SCORE x heads x sequence (eager attention's scores, softmax and mask; sdpa saves none of them). Calibrated
# on `bench memory`'s in-process measurement (fit.saved_bytes) of BERT and Llama shapes: an upper bound within 2.5x
# (tests/unit/test_memory_check.py). Counted at 4 bytes under --bf16 too: autocast saves the norms' and softmax's
# fp32 inputs beside bf16 casts of the weights.
FP32_PER_HIDDEN, FP32_PER_INTERMEDIATE, FP32_PER_SCORE = 16, 3, 3
FP32_REST_PER_HIDDEN = 4  # outside the layers, per token: embeddings, their norm, the pooler/head


def activation_bytes(model_config: Any, batch: int, seq: int, gradient_checkpointing: bool) -> float:
    """Bytes of activations a rank saves for backward at ``batch`` sequences of ``seq`` tokens, from the model's
    config (hidden size, layers, intermediate size, heads). Gradient checkpointing keeps each layer's input (one
    hidden-size tensor a token) and recomputes one layer at a time with all of its activations."""
    hidden, layers = model_config.hidden_size, model_config.num_hidden_layers
    intermediate = getattr(model_config, "intermediate_size", None) or 4 * hidden
    heads = getattr(model_config, "num_attention_heads", 1)
    layer = 4 * seq * (FP32_PER_HIDDEN * hidden + FP32_PER_INTERMEDIATE * intermediate + FP32_PER_SCORE * heads * seq)
    rest = 4 * seq * FP32_REST_PER_HIDDEN * hidden
    kept = layers * 4 * seq * hidden + layer if gradient_checkpointing else layers * layer
    return batch * (kept + rest)


def largest_tensor(model: Any) -> int:
    """The elements of ``model``'s largest tensor (its state dict's: a meta-device model will do), the ``largest``
    the memory parts count a save's gather by (engines/memory.py)."""
    return max((tensor.numel() for tensor in model.state_dict().values()), default=0)


def node_bytes(parts: dict[str, float], ranks: int) -> float:
    """``ranks`` sharing one memory, each at the peak ``parts`` (a save's gather too: fsdp's final output gathers
    each tensor on every rank)."""
    return sum(parts.values()) * ranks


def check_peak_fits(engine: str, params: int, parts: dict[str, float], ranks: int, device: torch.device) -> None:
    """Refuse, before the model is built, a run whose ``ranks`` on one device's memory (a node's RAM on CPU, else
    one GPU) cannot peak within the memory free now: ``parts`` is a rank's peak as the engines' memory model counts
    it (its row's memory part, engines/memory.py)."""
    need, free = node_bytes(parts, ranks), memory_available(device)
    if need <= free:
        return
    where = f"{ranks} ranks on this node" if ranks > 1 else f"on {device}"
    counted = ", ".join(f"{name} {value / GIB:.1f}" for name, value in parts.items() if value)
    raise UsageError(
        f"--engine {engine} needs {need / GIB:.1f} GiB ({where}) for {params / 1e6:.0f}M parameters (a rank's peak: "
        f"{counted} GiB) but {free / GIB:.1f} GiB is free",
        "run fewer ranks per node, shard the state with --engine fsdp, add --gradient_checkpointing, lower "
        "--per_device_train_batch_size or --max_seq_length, train LoRA adapters (--use_peft), or use a smaller model",
    )
