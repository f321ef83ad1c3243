"""Mixed precision, the same for every engine: autocast around forward passes, a GradScaler for fp16.

fp32 (the default) is a no-op everywhere: no autocast, no scaler, the optimizer steps as before, so
results stay bit-identical. bf16 runs on CPUs and GPUs and needs no loss scaling. fp16 needs a CUDA GPU
and a GradScaler; its unscale/clip/step order is the engine's business (``Engine.clip_and_step``),
because Horovod must finish its all-reduce before the gradients are unscaled.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from horovod_train.common.errors import UsageError

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
SCALER_KEY = "grad_scaler"  # in a checkpoint's training state


def precision_of(bf16: bool, fp16: bool) -> str:
    """The mode of --bf16/--fp16 (config.validate refuses both)."""
    return "bf16" if bf16 else "fp16" if fp16 else "fp32"


def enable_tf32() -> None:
    """TF32 tensor cores for float32 matmuls (CUDA, Ampere and later; cuDNN convolutions use TF32 by
    default). Call it only on CUDA: the setting is process-wide."""
    torch.set_float32_matmul_precision("high")


def autocast_to(device_type: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Autocast to ``dtype`` (None: no autocast). The dtype is explicit because autocast's state is per
    thread: a thread that opens ``autocast(enabled=True)`` without one gets the device's default
    (float16 on CUDA), whatever the thread that started it had chosen."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype)


class Precision:
    def __init__(self, mode: str, device: torch.device) -> None:
        if mode not in DTYPES:
            raise UsageError(f"unknown precision {mode!r}", f"use {', '.join(DTYPES)}")
        if mode == "fp16" and device.type != "cuda":
            raise UsageError(
                "--fp16 needs a CUDA GPU (float16 autocast with loss scaling)", "use --bf16 on CPU, or run on a GPU"
            )
        if mode == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise UsageError(f"--bf16 is not supported by {torch.cuda.get_device_name(device)}", "use --fp16")
        self.mode, self.device, self.dtype = mode, device, DTYPES[mode]
        self.scaler = torch.amp.GradScaler("cuda") if mode == "fp16" else None

    @classmethod
    def from_args(cls, args: Any, device: torch.device) -> Precision:
        return cls(precision_of(args.bf16, args.fp16), device)

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast_to(self.device.type, self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def state_dict(self) -> dict[str, Any]:
        return {SCALER_KEY: self.scaler.state_dict()} if self.scaler else {}

    def load_state_dict(self, training_state: dict[str, Any]) -> None:
        if self.scaler and SCALER_KEY in training_state:
            self.scaler.load_state_dict(training_state[SCALER_KEY])


def unscale(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
    """Divide the gradients by the loss scale (before clipping); a no-op without a scaler."""
    if scaler is not None:
        scaler.unscale_(optimizer)


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
    """``optimizer.step()``, or the scaler's step (skipped on inf/NaN gradients) and scale update."""
    if scaler is None:
        optimizer.step()
        return
    scaler.step(optimizer)
    scaler.update()
