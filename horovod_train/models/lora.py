"""LoRA with the peft library (--use_peft): low-rank adapters on the attention projections, the
classification head trained in full. Every engine then all-reduces and broadcasts the trainable
parameters alone: the adapters and the head, a few percent of the model."""

from __future__ import annotations

import importlib.util
import re
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from horovod_train.common.errors import UsageError

# The classification heads of transformers' *ForSequenceClassification, trained in full beside the adapters:
# peft's SEQ_CLS task adds classifier/score; DeBERTa's pooler and ModernBERT's head sit on top of the encoder
# too and start random.
HEAD_MODULES = ("classifier", "score", "pooler", "head")
# Beside a merged model (the output directory, a checkpoint): the adapter as peft saves it (adapter_config.json,
# adapter_model.safetensors), loadable with peft.AutoPeftModelForSequenceClassification.
ADAPTER_DIR = "adapter"
# peft's names for the model's tensors: under the wrapper's prefix, an adapted layer's own weights under
# base_layer, a head trained in full as modules_to_save.<adapter> beside its untouched original_module.
PEFT_PREFIX = "base_model.model."
ADAPTER_PART = re.compile(r"\.(lora_[^.]+|original_module)\.")
WRAPPER_PART = re.compile(r"\.(base_layer|modules_to_save\.[^.]+)\.")


@dataclass(frozen=True)
class LoraOptions:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_modules: tuple[str, ...] | None = None


def check_installed() -> None:
    """peft is an optional dependency (the `peft` extra): --use_peft without it is a usage error, not a traceback."""
    # find_spec is None also for a package blocked with sys.modules["peft"] = None.
    if importlib.util.find_spec("peft") is None:
        raise UsageError(
            "--use_peft needs the peft package (not installed)",
            "pip install 'horovod-train[peft]' (or pip install peft), or drop --use_peft",
        )


def default_targets(model: nn.Module) -> list[str] | None:
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    return DEFAULTS.get(getattr(model.config, "model_type", ""))


def linear_names(model: nn.Module) -> list[str]:
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)})


def target_modules(model: nn.Module, options: LoraOptions) -> list[str]:
    """The modules to adapt: --lora_target_modules, else peft's defaults for the architecture."""
    model_type = getattr(model.config, "model_type", "?")
    targets = list(options.target_modules or default_targets(model) or [])
    linears = linear_names(model)
    if not targets:
        raise UsageError(
            f"peft knows no default LoRA target modules for {model_type} models",
            f"pass --lora_target_modules with some of its linear layers ({', '.join(linears)})",
        )
    missing = [t for t in targets if t not in linears]
    if missing:
        raise UsageError(
            f"--lora_target_modules {','.join(missing)}: no such linear layer in this {model_type} model",
            f"choose among {', '.join(linears)}",
        )
    return targets


def wrap(model: nn.Module, options: LoraOptions) -> nn.Module:
    """``model`` with LoRA adapters; only the adapters and the head require gradients."""
    from peft import LoraConfig, TaskType, get_peft_model

    heads = [name for name, _ in model.named_children() if name in HEAD_MODULES]
    config = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=options.r,
        lora_alpha=options.alpha,
        lora_dropout=options.dropout,
        target_modules=target_modules(model, options),
        modules_to_save=heads,
    )
    with warnings.catch_warnings():
        # peft's PeftModel reads the model's is_gradient_checkpointing, which transformers 5 renamed and warns
        # of (FutureWarning, on every rank); this is the name peft reads, not ours to change.
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(model, config)


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "peft_config")


def merge_in_place(model: nn.Module) -> nn.Module:
    """The plain transformers model under ``model``, with the adapters folded into its weights. ``model`` is
    consumed: merging a copy would hold a second copy of the base model (14 GB more at the end of a 7B run)."""
    return model.merge_and_unload()


FLAGS = ("use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")


def settings(model: nn.Module) -> dict[str, Any]:
    """The LoRA settings ``model`` was built with, under the flags' names (what a checkpoint must agree with:
    they change its tensors' shapes or what they compute). The target modules as peft resolved them, so that
    naming peft's defaults is the same as omitting --lora_target_modules."""
    if not is_peft(model):
        return {"use_peft": False}
    config = model.peft_config[model.active_adapter]
    return {
        "use_peft": True,
        "lora_r": config.r,
        "lora_alpha": config.lora_alpha,
        "lora_dropout": config.lora_dropout,
        "lora_target_modules": sorted(config.target_modules),
    }


def as_flag(name: str, value: Any) -> str:
    """A setting of ``settings`` as the command line gives it: ``--lora_r 4``, ``--lora_target_modules q,v``."""
    if name == "use_peft":
        return "--use_peft" if value else "no --use_peft"
    return f"--{name} {','.join(value) if isinstance(value, list) else value}"


def plain_name(key: str) -> str | None:
    """The name that the merged model gives the tensor peft's state dict calls ``key``; None: the merged model
    has no such tensor (an adapter, a head's original module), or ``key`` is not peft's."""
    if not key.startswith(PEFT_PREFIX) or ADAPTER_PART.search(key):
        return None
    return WRAPPER_PART.sub(".", key.removeprefix(PEFT_PREFIX))


@torch.no_grad()
def split_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``model``'s state as (the merged model's state dict, as ``merge_in_place`` would make it; the tensors of
    ``model``'s state dict that it does not hold as they are, under peft's names: the adapted layers' base
    weights, the adapters, the heads' original modules). Together they are ``model``'s state exactly (a merged
    weight cannot be un-merged exactly); ``model`` itself is left as it is. The merged weights are made on the
    CPU, where a checkpoint is written from: no second copy of the adapted layers on the GPU."""
    adapter = model.active_adapter
    adapted = {f"{name}.base_layer.weight": module for name, module in model.named_modules() if _is_lora_layer(module)}
    merged, rest = {}, {}
    for key, tensor in model.state_dict().items():
        plain = plain_name(key)
        if plain is None:
            rest[key] = tensor
            continue
        layer = adapted.get(key)
        if layer is not None:
            rest[key] = tensor
            # As peft's merge does (base_layer.weight += delta), into a new tensor.
            tensor = (tensor.cpu() + layer.get_delta_weight(adapter).cpu()).to(tensor.dtype)
        merged[plain] = tensor
    return merged, rest


def _is_lora_layer(module: nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer

    return isinstance(module, LoraLayer)
