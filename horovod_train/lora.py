"""LoRA with the peft library (--use_peft): low-rank adapters on the attention projections, the
classification head trained in full. Every engine then all-reduces and broadcasts the trainable
parameters alone: the adapters and the head, a few percent of the model."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from torch import nn

from horovod_train.errors import UsageError

# The classification heads of transformers' *ForSequenceClassification, trained in full beside the adapters:
# peft's SEQ_CLS task adds classifier/score; DeBERTa's pooler and ModernBERT's head sit on top of the encoder
# too and start random.
HEAD_MODULES = ("classifier", "score", "pooler", "head")


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
    return get_peft_model(model, config)


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "peft_config")


def merge_in_place(model: nn.Module) -> nn.Module:
    """The plain transformers model under ``model``, with the adapters folded into its weights. ``model`` is
    consumed: merging a copy would hold a second copy of the base model (14 GB more at the end of a 7B run)."""
    return model.merge_and_unload()
