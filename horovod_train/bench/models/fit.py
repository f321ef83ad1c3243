"""What fits on one GPU: bytes per parameter of each memory mode and engine, plus measured activations.

peak = P x weight_bytes + T x (grad_bytes + optimizer_bytes) + engine_extra + activations + reserve

- P parameters, T of them trainable (all of them, or LoRA's adapters and head);
- weights 4 bytes (fp32; 2 for LoRA's frozen weights in bf16), gradients 4, AdamW's two moments 8;
  (the engines' memory model, the rows' memory part's state_bytes at one rank, owns these);
- engine_extra: Horovod's fusion buffer (``--fusion_threshold_mb``, at most the gradients); DDP none
  (the ddp engine passes ``gradient_as_bucket_view=True``: the gradients live in the buckets; DDP's default
  would add one gradient-sized copy); DataParallel's GPU 0 one more gradient-sized buffer (replicas'
  gradients are summed into it); single none;
- activations = b x (L x layer(s) + rest(s)), b sequences per GPU, L layers, ``layer`` the bytes a layer
  saves for backward per sequence (measured: ``saved_bytes``); with gradient checkpointing each layer keeps
  its input alone (s x h x 4 bytes) and one layer at a time is recomputed with all of its activations;
- reserve: CUDA context, allocator slack and workspaces (assumed, not measured).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from horovod_train.bench.engine_names import memory_of, whole_state_engines

GB = 1e9  # a GPU's "80 GB" is 80 x 10^9 bytes (an H100 80GB shows 79.6 GiB... of 85.0 GB)
FP32, BF16 = 4, 2
GRAD_BYTES = 4  # fp32 gradient (all-reduced); the state as a whole: the engines' memory model
MODES = ("full", "gc", "lora", "lora+gc", "lora-bf16+gc")  # gc: gradient checkpointing; bf16: frozen weights
ENGINES = whole_state_engines()  # those that hold the whole state on every rank
BYTES_PER_PARAM = {  # weights + gradients + AdamW, per parameter (T/P: the trainable fraction)
    "full": "16",
    "gc": "16",
    "lora": "4 + 12 T/P",
    "lora+gc": "4 + 12 T/P",
    "lora-bf16+gc": "2 + 14 T/P",
}
DEFAULT_RESERVE = 2 * GB
DEFAULT_FUSION = 128 * 2**20  # Horovod 0.28's default fusion threshold


@dataclass(frozen=True)
class Activations:
    """Bytes saved for backward per sequence of length ``seq``: per transformer layer, and outside them."""

    seq: int
    hidden: int
    layer: float  # one layer's saved tensors, per sequence
    rest: float  # embeddings, head and loss, per sequence

    @property
    def per_token_per_hidden(self) -> float:
        """layer / (s x h): constant across a family with fixed head size and MLP ratio (scales the shape)."""
        return self.layer / (self.seq * self.hidden)


@dataclass(frozen=True)
class Model:
    name: str
    params: int
    hidden: int
    layers: int
    trainable_lora: int  # trainable parameters with LoRA (adapters + head)
    largest: int = 0  # elements of its largest tensor (what fsdp's final output gathers at once)


def is_lora(mode: str) -> bool:
    return mode.startswith("lora")


def checkpointed(mode: str) -> bool:
    return mode == "gc" or mode.endswith("+gc")


def state_bytes(model: Model, mode: str) -> float:
    """Weights, gradients and AdamW moments on one GPU, as the engines' memory model counts them (at one rank,
    where every engine holds the whole state: fp32 weights); frozen weights held in bf16 take 2 bytes, not 4."""
    trained = trainable(model, mode)
    held = memory_of(ENGINES[0]).state_bytes(model.params, trained, 1)
    return held - (FP32 - BF16) * (model.params - trained) if "bf16" in mode else held


def trainable(model: Model, mode: str) -> int:
    """Parameters trained in ``mode``: LoRA's adapters and head, or all of them."""
    return model.trainable_lora if is_lora(mode) else model.params


def engine_extra(model: Model, mode: str, engine: str, fusion_bytes: float = DEFAULT_FUSION) -> float:
    """What ``engine``'s reduction holds beside the gradients, as the engines' memory model counts it."""
    return memory_of(engine).buffer_bytes(trainable(model, mode), fusion_bytes)


def activation_bytes(model: Model, mode: str, batch: int, act: Activations) -> float:
    """Activations of ``batch`` sequences, scaled from the measured shape to ``model``'s hidden size."""
    layer = act.per_token_per_hidden * act.seq * model.hidden
    rest = act.rest * model.hidden / act.hidden
    if checkpointed(mode):
        kept_inputs = model.layers * act.seq * model.hidden * FP32
        return batch * (kept_inputs + layer + rest)
    return batch * (model.layers * layer + rest)


def peak_bytes(model: Model, mode: str, engine: str, batch: int, act: Activations, reserve: float = DEFAULT_RESERVE,
               fusion_bytes: float = DEFAULT_FUSION) -> float:  # fmt: skip
    return (
        state_bytes(model, mode)
        + engine_extra(model, mode, engine, fusion_bytes)
        + activation_bytes(model, mode, batch, act)
        + reserve
    )


def largest_fitting(models: list[Model], fits: Callable[[Model], bool]) -> Model | None:
    """The model with the most parameters among those that fit (None if none does)."""
    fitting = [m for m in models if fits(m)]
    return max(fitting, key=lambda m: m.params, default=None)


def activation_kind(mode: str) -> str:
    """Whose measured activations a mode uses: full fine-tuning's (checkpointing keeps less of the same), or LoRA's."""
    return "lora" if is_lora(mode) else "full"


def fit_rows(models: list[Model], acts: dict[tuple[str, int], Activations], batch: int, gpu_bytes: float = 80 * GB,
             reserve: float = DEFAULT_RESERVE) -> list[dict[str, Any]]:  # fmt: skip
    """Per sequence length, engine and mode: the largest of ``models`` that fits in ``gpu_bytes``, with ``acts``
    measured per (activation_kind, sequence length)."""
    rows = []
    for seq in sorted({s for _, s in acts}):
        for engine in ENGINES:
            for mode in MODES:
                act = acts[(activation_kind(mode), seq)]

                def need(m: Model, mode: str = mode, engine: str = engine, act: Activations = act) -> float:
                    return peak_bytes(m, mode, engine, batch, act, reserve)

                best = largest_fitting(models, lambda m, need=need: need(m) <= gpu_bytes)
                rows.append(
                    {
                        "engine": engine,
                        "mode": mode,
                        "seq": seq,
                        "batch": batch,
                        "largest": best.name if best else "none",
                        "params": best.params if best else 0,
                        "peak_gb": need(best) / GB if best else float("nan"),
                    }
                )
    return rows


def saved_bytes(run: Callable[[], Any], exclude: Iterable[Any] = ()) -> int:
    """Bytes of the distinct tensors autograd saves for backward while ``run()`` runs its forward pass
    (what the activations cost until backward frees them); storages shared by several saves count once,
    and those of ``exclude`` (the model's parameters and buffers, saved by reference) not at all."""
    import torch

    skip = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(storages.values())
