"""`horovod-train checkpoint SOURCE DESTINATION --to whole|sharded|trainer`: a checkpoint in the other form (torch's
``dcp_to_torch_save`` and ``torch_save_to_dcp``, for this trainer's checkpoints), or as transformers' Trainer
resumes one (checkpoint_trainer.py).

Both forms hold the same ``model.safetensors``; they differ in the optimizer's tensors. The whole form (what
horovod, ddp, dp and single write) keeps them in ``training_state.pt``; the sharded form (fsdp's and zero1's) in
``optimizer/``, a torch.distributed.checkpoint directory (engines/state_io.py). Every engine resumes either form at
any world size, so this is for tools that read one form: the whole form is one ``torch.load`` away, and is what a
checkpoint of before sharded saves looks like. SOURCE is verified against its manifest and left as it is; the
converted checkpoint is written to a temporary directory and renamed to DESTINATION, which must not exist.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from horovod_train.common.console import write_line
from horovod_train.common.errors import UsageError
from horovod_train.common.files import atomic_directory
from horovod_train.engines import state_io
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.checkpoint_trainer import write_trainer_checkpoint
from horovod_train.outputs.run_directory import named_checkpoint

FORMS = ("whole", "sharded")
TRAINER = "trainer"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0]
    parser.add_argument("source", help="a checkpoint-<step> directory")
    parser.add_argument("destination", help="the converted checkpoint's directory (must not exist)")
    parser.add_argument(
        "--to",
        choices=(*FORMS, TRAINER),
        required=True,
        help="the form to write (trainer: for transformers' Trainer to resume)",
    )


def main(args: argparse.Namespace) -> int:
    source, destination = Path(args.source), Path(args.destination)
    named_checkpoint(args.source)
    ckpt.verify_checkpoint(source)
    if destination.exists():
        raise UsageError(f"{destination} exists", "name a new directory: the conversion writes a checkpoint anew")
    if args.to == TRAINER:
        write_trainer_checkpoint(source, destination)
        write_line(f"wrote {destination}: {source} for transformers' Trainer to resume")
        return 0
    state = torch.load(source / ckpt.STATE_FILE, map_location="cpu", weights_only=True)
    optimizer = state["optimizer"]
    sharded = isinstance(optimizer, dict) and state_io.SHARDED in optimizer
    if sharded == (args.to == "sharded"):
        raise UsageError(f"checkpoint {source} is already {args.to}", f"copy it, or convert it with --to {other(args)}")
    with atomic_directory(destination) as tmp:
        ckpt.copy_all_but_state(source, tmp)
        if sharded:
            state["optimizer"] = state_io.read_whole_optimizer(source / optimizer[state_io.SHARDED],
                                                               optimizer["param_groups"])  # fmt: skip
        else:
            state_io.write_whole_optimizer(optimizer["state"], tmp / state_io.OPTIMIZER_DIR)
            state["optimizer"] = state_io.optimizer_marker(optimizer["param_groups"])
        with (tmp / ckpt.STATE_FILE).open("wb") as f:
            torch.save(state, f)
        ckpt.seal(tmp)
    write_line(f"wrote {destination}: the {args.to} form of {source}")
    return 0


def other(args: argparse.Namespace) -> str:
    return next(form for form in FORMS if form != args.to)
