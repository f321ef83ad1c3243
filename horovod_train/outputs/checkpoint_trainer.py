"""`horovod-train checkpoint SOURCE DESTINATION --to trainer`: a checkpoint as transformers' Trainer writes one, for
``Trainer(...).train(resume_from_checkpoint=DESTINATION)``.

The model's files are copied as they are (they are already a transformers directory). The optimizer's state is
re-keyed: this trainer numbers the parameters by its groups (training/build.py's ``decay_groups``), the Trainer by
its own (``Trainer.create_optimizer``: its ``get_decay_parameter_names``, then the rest), so each parameter's moments
move to the Trainer's number for it. The learning rate continues from the step: ``scheduler.pt`` is a LambdaLR's
state at ``global_step``, whose factor is the Trainer's own schedule (the resuming run names the same
--lr_scheduler_type, warmup and max_steps). ``rng_state.pth`` (and ``rng_state_<rank>.pth`` for each rank saved) holds
the generators in the Trainer's format. No ``training_args.bin``: the Trainer writes it for the record and never reads
it on resume.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, Trainer, TrainerState

from horovod_train.common.errors import UsageError
from horovod_train.common.files import atomic_directory
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.training.build import decay_groups

# The Trainer's file names (transformers.trainer's OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME).
OPTIMIZER_FILE, SCHEDULER_FILE, RNG_FILE = "optimizer.pt", "scheduler.pt", "rng_state.pth"


def write_trainer_checkpoint(source: Path, destination: Path) -> None:
    """``source`` (verified, either form) as a Trainer's checkpoint directory at ``destination`` (which must not
    exist: the caller checked)."""
    if (source / ckpt.LORA_FILE).exists():
        raise UsageError(
            f"checkpoint {source} is a LoRA run's: its optimizer steps the adapters, which a Trainer's checkpoint of "
            "the merged model has no place for",
            "convert a full fine-tuning run's checkpoint, or resume the LoRA run with horovod-train",
        )
    _, training_state, ours = ckpt.load_checkpoint(source)
    with atomic_directory(destination) as tmp:
        ckpt.copy_all_but_state(source, tmp)  # its trainer_state.json is rewritten below
        names = trainer_order(source)
        torch.save(trainer_optimizer(training_state["optimizer"], names, source), tmp / OPTIMIZER_FILE)
        torch.save(scheduler_state(training_state, ours["global_step"]), tmp / SCHEDULER_FILE)
        rngs = training_state["rng"]
        torch.save(trainer_rng(rngs[0]), tmp / RNG_FILE)  # a one-process resume's
        for rank, state in enumerate(rngs if len(rngs) > 1 else []):
            torch.save(trainer_rng(state), tmp / f"rng_state_{rank}.pth")  # each rank's of a distributed resume
        (tmp / ckpt.TRAINER_FILE).write_text(json.dumps(trainer_state(ours, source), indent=2, sort_keys=True) + "\n")


Groups = tuple[list[str], list[str]]  # the names of the parameters with weight decay, and of those without


def trainer_order(source: Path) -> tuple[Groups, Groups, dict[str, tuple[int, ...]]]:
    """Our groups, the Trainer's, and every parameter's shape, of the checkpoint's model (built on the meta device:
    names and shapes, no memory)."""
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(source))
    # get_decay_parameter_names does not use its Trainer: the Trainer's own rule, called rather than copied.
    decayed = set(Trainer.get_decay_parameter_names(None, model))  # type: ignore[arg-type]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    theirs = [n for n in trainable if n in decayed], [n for n in trainable if n not in decayed]
    return decay_groups(model), theirs, {name: tuple(p.shape) for name, p in model.named_parameters()}


def trainer_optimizer(
    saved: dict[str, Any], order: tuple[Groups, Groups, dict[str, tuple[int, ...]]], source: Path
) -> dict[str, Any]:
    """Our AdamW state dict with its parameters numbered, and grouped, as the Trainer's optimizer numbers them."""
    (ours_decay, ours_rest), (their_decay, their_rest), shapes = order
    groups = saved["param_groups"]
    if [len(group["params"]) for group in groups] != [len(ours_decay), len(ours_rest)]:
        raise UsageError(f"checkpoint {source} has optimizer groups that do not fit its model's parameters",
                         "convert a checkpoint written by horovod-train's full fine-tuning")  # fmt: skip
    ours = {name: index for index, name in enumerate(ours_decay + ours_rest)}
    state = {new: saved["state"][ours[name]] for new, name in enumerate(their_decay + their_rest)
             if ours[name] in saved["state"]}  # fmt: skip
    names = their_decay + their_rest
    # A moment of another shape than its parameter would fail only in the Trainer's first step (fused AdamW: badly).
    misfit = next((names[i] for i, entry in state.items() if tuple(entry["exp_avg"].shape) != shapes[names[i]]), None)
    if misfit is not None:
        raise UsageError(f"checkpoint {source} holds optimizer state for {misfit} of another shape than its model's",
                         "convert a checkpoint written by horovod-train's full fine-tuning")  # fmt: skip
    decay, rest = ({k: v for k, v in group.items() if k != "params"} for group in groups)
    # A parameter the Trainer decays that we did not (or the reverse) takes its new group's settings.
    return {"state": state, "param_groups": [
        {**decay, "params": list(range(len(their_decay)))},
        {**rest, "params": list(range(len(their_decay), len(their_decay) + len(their_rest)))},
    ]}  # fmt: skip


def scheduler_state(training_state: dict[str, Any], global_step: int) -> dict[str, Any]:
    """A LambdaLR's state after ``global_step`` steps (what the Trainer's schedule saves); its factor is the
    resuming Trainer's own lambda, which load_state_dict keeps."""
    base_lr = training_state["scheduler"]["base_lr"]
    groups = training_state["optimizer"]["param_groups"]
    return {"base_lrs": [base_lr] * len(groups), "last_epoch": global_step, "_step_count": global_step + 1,
            "_get_lr_called_within_step": False, "_last_lr": [group["lr"] for group in groups],
            "lr_lambdas": [None] * len(groups)}  # fmt: skip


def trainer_rng(state: dict[str, Any]) -> dict[str, Any]:
    """One rank's generators (rng.capture's lists) in the Trainer's format (its ``_save_rng_state``)."""
    py, nps = state["python"], state["numpy"]
    converted = {
        "python": (py["version"], tuple(py["internal"]), py["gauss"]),
        "numpy": ("MT19937", np.array(nps["key"], dtype=np.uint32), nps["pos"], nps["has_gauss"], nps["cached"]),
        "cpu": torch.tensor(state["torch"], dtype=torch.uint8),
    }
    if "cuda" in state:  # a checkpoint of before rng.restore_cuda's form saved every device's: the first
        cuda = state["cuda"][0] if state["cuda"] and isinstance(state["cuda"][0], list) else state["cuda"]
        converted["cuda"] = torch.tensor(cuda, dtype=torch.uint8)
    return converted


def trainer_state(ours: dict[str, Any], source: Path) -> dict[str, Any]:
    """Our trainer_state.json as the Trainer's ``TrainerState`` (which refuses keys it does not have)."""
    config = ours.get("config", {})
    best = ours.get("best_model_checkpoint")
    state = {
        "global_step": ours["global_step"],
        "max_steps": ours.get("total_steps", 0),
        "epoch": float(ours.get("epoch", 0)),
        "log_history": ours.get("log_history", []),
        "best_metric": ours.get("best_metric"),
        # Ours is a name in the run's directory (the Trainer's a path), else a path already.
        "best_model_checkpoint": str(source.parent / best) if best and "/" not in best else best,
        "train_batch_size": config.get("per_device_train_batch_size"),
        "num_train_epochs": config.get("num_train_epochs", 0),
        **{
            name: config[name]
            for name in ("logging_steps", "eval_steps", "save_steps")
            if isinstance(config.get(name), int)
        },  # fmt: skip
    }
    TrainerState(**state)  # what load_from_json will do: a key it lacks would fail there, not in this conversion
    return state
