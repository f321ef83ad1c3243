"""Checkpoints that survive crashes and load without unpickling arbitrary objects.

A checkpoint is a directory ``checkpoint-<step>`` holding

- the model as a plain transformers directory: ``model.safetensors`` with its ``config.json`` and the
  tokenizer's files, so that ``AutoModelForSequenceClassification.from_pretrained`` loads the trained
  weights from it as it is. A LoRA run's (--use_peft) is the merged model, as its final output is;
- for a LoRA run also ``adapter/``, the adapter as peft saves it (``PeftModel.from_pretrained`` on the
  base model, ``AutoPeftModelForSequenceClassification``), and ``lora_state.safetensors``: the tensors of
  the trained (peft) model that the merged weights do not hold as they are (the adapted layers' base
  weights, the adapters, the heads' original modules, under peft's names). A merged weight cannot be
  un-merged exactly: with them, a resume restores the trained model bit for bit;
- ``training_state.pt``: the optimizer state and every rank's RNG states (``torch.save``, read back with
  ``weights_only=True``). A sharded engine's (fsdp, zero1) holds the optimizer's groups alone: its tensors are in
  ``optimizer/``, a torch.distributed.checkpoint directory every rank wrote its shards into, and every rank wrote
  its rows of ``model.safetensors`` (engines/state_io.py). Any engine, at any world size, resumes either form;
- ``trainer_state.json``: the training position, the run configuration, what a run resuming it must
  agree with (``Compatibility``), the save order and the run's lineage;
- ``manifest.json``: the SHA-256 of every other file (those in ``adapter/`` by their relative path).

It is written to a temporary directory, every file fsynced, then renamed into place (the parent fsynced
too), so a crash mid-write, or a full disk, leaves the previous checkpoint valid; a truncated or altered
file fails the manifest check and is reported, never half-loaded. A checkpoint of the same step is replaced
only once its successor is complete, and rotation removes only older checkpoints of the run's own lineage
(the checkpoints it, and the runs it resumed from, wrote), never the one just written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from horovod_train.common.digest import sha256
from horovod_train.common.errors import UsageError
from horovod_train.common.files import (
    atomic_directory,
    disk_full,
    fsync_directory,
    full_disk_problem,
    temporary_sibling,
)
from horovod_train.engines.state_io import (
    OPTIMIZER_DIR,
    SHARDED,
    WHOLE_STATE,
    optimizer_marker,
    param_groups,
    read_whole_optimizer,
)
from horovod_train.models import lora
from horovod_train.outputs.checkpoint_layout import (
    AUTO,
    LATEST,
    MANIFEST,
    TRAINER_FILE,
)
from horovod_train.outputs.run_directory import RunDirectory, saved_state
from horovod_train.training.position import TrainingPosition

MODEL_FILE = "model.safetensors"
LORA_FILE = "lora_state.safetensors"  # a LoRA run's: what its merged MODEL_FILE does not hold as it trained it
STATE_FILE = "training_state.pt"
Payload = tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]  # tensors, training state, trainer state


@dataclass(frozen=True)
class Compatibility:
    """What a checkpoint must agree with to be loaded into a run. The position inside an epoch means the
    same examples only with the same training data as tokenized (its digest), the same order (the seed,
    --group_by_length) and the same global batch (ranks x per-device batch x accumulation); the model's
    tensors fit only a model of the same shape: LoRA's settings too (--lora_alpha and --lora_dropout change
    what the adapters compute, so a changed one would not continue the same training). A field that is None
    is not checked."""

    model_name_or_path: str
    num_labels: int
    vocab_size: int
    architecture: str
    global_batch: int | None  # None: any (an elastic run re-shards by examples seen)
    tokenizer: str | None = None  # data.tokenizer_digest: what fixes the ids it gives
    label_names: list[str] | None = None
    train_data: str | None = None  # digest of the tokenized training set
    seed: int | None = None
    group_by_length: bool | None = None
    # LoRA's settings, under the flags' names (lora.settings); a run without --use_peft has only use_peft.
    use_peft: bool | None = None
    lora_r: int | None = None
    lora_alpha: int | None = None
    lora_dropout: float | None = None
    lora_target_modules: list[str] | None = None  # as peft resolved them (its defaults when none were named)

    # Recorded since issue 18 (the data) and issue 34 (LoRA): a checkpoint written before lacks them, and is
    # resumed with a warning.
    ADDED_LATER = ("tokenizer", "label_names", "train_data", "seed", "group_by_length", *lora.FLAGS)

    def check(self, saved: dict[str, Any], path: Path, warn: Callable[[str], None] | None = None) -> None:
        checked = [f.name for f in fields(self) if getattr(self, f.name) is not None]
        unrecorded = [
            name for name in checked
            if (name in self.ADDED_LATER and name not in saved) or _digest_form(saved.get(name), getattr(self, name))
        ]  # fmt: skip
        # use_peft first: the architecture of a LoRA checkpoint is peft's wrapper, and the flag is the fix.
        for name in sorted(checked, key=lambda name: name != "use_peft"):
            ours = getattr(self, name)
            if name not in unrecorded and saved.get(name) != ours:
                raise UsageError(
                    f"checkpoint {path} was saved with {name}={saved.get(name)!r} but this run has {name}={ours!r}",
                    mismatch_fix(name, saved.get(name)),
                )
        if unrecorded and warn is not None:
            warn(f"warning: checkpoint {path} predates the checks of {', '.join(unrecorded)}: resuming without them")


def _digest_form(saved: Any, ours: Any) -> bool:
    """A digest recorded in an earlier form (``<form>:<hex>``; the form names what it covers): a checkpoint of
    before issue 34 knows its tokenizer by class and vocabulary alone, which cannot be compared with today's."""
    form = ours.split(":", 1)[0] if isinstance(ours, str) and ":" in ours else None
    return form is not None and not (isinstance(saved, str) and saved.startswith(form + ":"))


MISMATCH_FIX = (
    "resume with the same model, labels and global batch (ranks x --per_device_train_batch_size"
    " x --gradient_accumulation_steps), or start a new --output_dir"
)
MISMATCH_FIXES = {
    "tokenizer": "resume with the tokenizer the checkpoint was trained with (see its tokenizer files), "
    "or start a new --output_dir",
    "label_names": "resume with the same labels, or start a new --output_dir",
    "train_data": "resume with the same training data, --max_train_samples, --max_seq_length and tokenizer, "
    "or start a new --output_dir",
    "seed": "resume with the checkpoint's --seed, or start a new --output_dir",
    "group_by_length": "resume with --group_by_length as the checkpoint was trained, or start a new --output_dir",
}


def mismatch_fix(name: str, saved: Any) -> str:
    if name in lora.FLAGS:
        return f"resume with {lora.as_flag(name, saved)} as the checkpoint was trained, or start a new --output_dir"
    return MISMATCH_FIXES.get(name, MISMATCH_FIX)


class Checkpoints:
    """Rank 0's writer of one run's checkpoints in its directory, keeping the newest ``keep`` of its lineage (None:
    all)."""

    def __init__(self, run_dir: RunDirectory, keep: int | None, lineage: list[str] | None = None) -> None:
        self.run_dir, self.keep = run_dir, keep
        self.lineage = list(lineage or [])

    def save(
        self,
        model: torch.nn.Module,
        position: TrainingPosition,
        compatibility: Compatibility,
        config: dict[str, Any],
        training_state: dict[str, Any],
        write_loadable: Callable[[Path], None] | None = None,
        weights: dict[str, torch.Tensor] | None = None,
        shards: tuple[Path, dict[str, str]] | None = None,
    ) -> Path:
        """``write_loadable`` adds what ``from_pretrained`` needs besides the weights (config, tokenizer);
        ``weights``: ``model``'s whole state dict where ``model`` does not hold it (an engine that shards the model
        gathers it), else None. ``shards``: the temporary directory (``temporary``) where every rank of a sharded
        engine wrote its part of the state (its model file too, if it is there), and {file: SHA-256} of those the
        other ranks wrote. A full disk is a UsageError; the checkpoints already there are left as they were."""
        target = self.target(position.global_step)
        self.lineage = [name for name in self.lineage if name != target.name] + [target.name]
        trainer_state = {
            **position.to_dict(),
            "compatibility": asdict(compatibility),
            "config": config,
            "save_sequence": self.newest_sequence() + 1,
            "lineage": self.lineage,
        }
        tmp, written = shards or (None, {})
        with refusing_a_full_disk(target), atomic_directory(target, replace=True, tmp=tmp) as tmp:
            write_files(tmp, model, weights, training_state, trainer_state, write_loadable, written)
        self.run_dir.wrote_checkpoint(target)
        best = position.best_model_checkpoint  # a path: another directory's, not for this rotation to spare
        self.rotate(keep_also=target.name, best=best if best and "/" not in best else None)
        return target

    def target(self, step: int) -> Path:
        return self.run_dir.checkpoint(step)

    def newest_sequence(self) -> int:
        return max((saved_state(p).get("save_sequence", 0) for p in self.run_dir.checkpoints()), default=0)

    def temporary(self, step: int) -> Path:
        """Rank 0: the temporary directory the ranks of a sharded engine write step ``step``'s checkpoint into, for
        ``save`` to complete and rename (a crash leaves it to clean_stale)."""
        return temporary_sibling(self.target(step))

    def rotate(self, keep_also: str, best: str | None = None) -> None:
        """Delete the oldest beyond ``keep``, sparing the best checkpoint as transformers does (a limit of 1
        then keeps two: the best and the newest)."""
        directory = self.run_dir.path
        present = [name for name in self.lineage if (directory / name).is_dir()]
        doomed = present[: -self.keep] if self.keep else []
        if self.keep and best in present and best != present[-1]:
            others = [name for name in present if name != best]
            doomed = others[: -max(self.keep - 1, 1)]
        for name in doomed:
            if name != keep_also:
                self.run_dir.remove_checkpoint(name)
        self.lineage = [name for name in self.lineage if (directory / name).is_dir()]


def sharded_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A sharded checkpoint's ``training_state["optimizer"]``: the groups in torch's form; the tensors are in the
    directory every rank wrote (Engine.save_state_shards)."""
    return optimizer_marker(param_groups(optimizer))


def write_files(
    directory: Path,
    model: torch.nn.Module,
    weights: dict[str, torch.Tensor] | None,
    training_state: dict[str, Any],
    trainer_state: dict[str, Any],
    write_loadable: Callable[[Path], None] | None,
    written: dict[str, str] | None = None,
) -> None:
    """A checkpoint's files, the manifest last, every one fsynced. ``written``: {file: SHA-256} of those other
    processes wrote into ``directory`` (a sharded engine's ranks); a model file already there is theirs."""
    write_loadable_files(directory, model, weights, write_loadable)
    with (directory / STATE_FILE).open("wb") as f:  # a file object: its OSError stays the cause of torch's error
        torch.save(training_state, f)
    (directory / TRAINER_FILE).write_text(json.dumps(trainer_state, indent=2, sort_keys=True) + "\n")
    seal(directory, written)


def write_loadable_files(
    directory: Path, model: torch.nn.Module, weights: dict[str, torch.Tensor] | None,
    write_loadable: Callable[[Path], None] | None,
) -> None:  # fmt: skip
    """What ``from_pretrained`` reads: the model's files (unless other processes wrote them there: a sharded
    engine's ranks, or this one earlier, ahead of a save in the background) and ``write_loadable``'s."""
    if not (directory / MODEL_FILE).exists():
        write_model(model, model.state_dict() if weights is None else weights, directory)
    if write_loadable is not None:
        write_loadable(directory)


def seal(directory: Path, written: dict[str, str] | None = None) -> None:
    """The manifest, written last (``written``: digests other processes computed of files they wrote), then every
    file fsynced."""
    written = written or {}
    names = sorted({*_relative_files(directory), *written} - {MANIFEST})  # a listed file gone missing fails verify
    manifest = {name: written.get(name) or sha256(directory / name) for name in names}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    _fsync_tree(directory)


@contextlib.contextmanager
def refusing_a_full_disk(target: Path) -> Iterator[None]:
    """A full disk while the checkpoint ``target`` is written is a UsageError naming its run directory's filesystem
    (the temporary directory is gone by then, the checkpoints already there are as they were); any other error
    passes."""
    try:
        yield
    except Exception as error:
        if not disk_full(error):
            raise
        raise UsageError(
            f"{full_disk_problem(error, target.parent)}: {target.name} was not written (the earlier checkpoints are "
            "intact)",
            "free space there and resume with --resume_from_checkpoint auto, or point --output_dir elsewhere",
        ) from error


def write_model(model: torch.nn.Module, weights: dict[str, torch.Tensor], directory: Path) -> None:
    """The model's files of a checkpoint (see the module's docstring): ``weights``, the training model's whole
    state dict, as it is."""
    if not lora.is_peft(model):
        save_file(distinct_tensors(weights, tied_copies(model)), directory / MODEL_FILE)
        return
    merged, rest = lora.split_state(model)
    save_file(distinct_tensors(merged, tied_copies(model)), directory / MODEL_FILE)
    save_file(distinct_tensors(rest), directory / LORA_FILE)
    model.save_pretrained(directory / lora.ADAPTER_DIR)


def model_state(tensors: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict, for a strict load, from a checkpoint's tensors: each under its own name, else
    (a LoRA model's tensors that the merged model holds as they are) under the merged model's name; every
    name of a tied tensor."""
    state = {}
    for key in model.state_dict():
        source = key if key in tensors else lora.plain_name(key)
        if source in tensors:
            state[key] = tensors[source]
    return with_shared_tensors(state, model)


def tied_copies(model: torch.nn.Module) -> set[str]:
    """The names transformers ties to another (a peft model answers with its base model's: the merged names)."""
    return set(getattr(model, "all_tied_weights_keys", None) or {})


def _storage_groups(state: dict[str, torch.Tensor]) -> list[list[str]]:
    """The state dict's names grouped by the tensor they name (tied weights: one tensor, several names)."""
    groups: dict[tuple, list[str]] = {}
    for name, tensor in state.items():
        view = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tensor.shape,
            tensor.stride(),
        )
        groups.setdefault(view, []).append(name)
    return list(groups.values())


def distinct_tensors(state: dict[str, torch.Tensor], tied_copies: Iterable[str] = ()) -> dict[str, torch.Tensor]:
    """``state`` with each tied tensor once, under the name ``save_pretrained`` keeps (the tie's source, not one
    of ``tied_copies``), as safetensors refuses tensors that share memory (BART/T5-style tied embeddings)."""
    copies = set(tied_copies)
    kept = {}
    for names in _storage_groups(state):
        name = next((n for n in names if n not in copies), names[0])
        kept[name] = state[name].detach().cpu().contiguous()
    # Views of one storage that are not the same tensor (rare): saved as copies of their own.
    seen: set[int] = set()
    for name, tensor in kept.items():
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in seen:
            kept[name] = tensor.clone()
        seen.add(pointer)
    return kept


def with_shared_tensors(tensors: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``tensors`` (saved by ``distinct_tensors``) with every name of a tied tensor, for a strict load."""
    full = dict(tensors)
    for names in _storage_groups(model.state_dict()):
        present = next((n for n in names if n in tensors), None)
        if present is not None:
            full.update({n: tensors[present] for n in names if n not in tensors})
    return full


def _relative_files(directory: Path) -> list[str]:
    return sorted(path.relative_to(directory).as_posix() for path in directory.rglob("*") if path.is_file())


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*"), reverse=True):  # a directory after what it holds
        if path.is_dir():
            fsync_directory(path)
        else:
            with path.open("rb") as f:
                os.fsync(f.fileno())
    fsync_directory(directory)


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Check every file against the manifest; return the trainer state. Nothing is loaded on failure."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise UsageError(
            f"checkpoint {path} has no readable {MANIFEST} (incomplete or not a checkpoint)",
            "resume from an earlier checkpoint",
        ) from None
    # A manifest is {file path inside the checkpoint: SHA-256} covering at least the files a resume reads.
    entries = manifest if isinstance(manifest, dict) else {}
    read = {MODEL_FILE, STATE_FILE, TRAINER_FILE} | ({LORA_FILE} if (path / LORA_FILE).exists() else set())
    missing = sorted(read - set(entries))
    if missing or not all(isinstance(k, str) and isinstance(v, str) and _inside(k) for k, v in entries.items()):
        shown = f"lists no {', '.join(missing)}" if missing else "is not a mapping of file names to SHA-256 digests"
        raise UsageError(
            f"checkpoint {path} has a {MANIFEST} that {shown} (not written by this trainer)",
            "resume from an earlier checkpoint",
        )
    for name, digest in entries.items():
        file = path / name
        if not file.is_file() or sha256(file) != digest:
            raise UsageError(
                f"checkpoint {path} is corrupted ({name} does not match its checksum)",
                "resume from an earlier checkpoint",
            )
    try:
        state = json.loads((path / TRAINER_FILE).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        state = None
    if not isinstance(state, dict):
        raise UsageError(
            f"checkpoint {path} has a {TRAINER_FILE} that is not a JSON object", "resume from an earlier checkpoint"
        )
    return state


def manifest_files(path: Path) -> list[str]:
    """The files a verified checkpoint's manifest lists."""
    return sorted(json.loads((path / MANIFEST).read_text()))


def copy_all_but_state(source: Path, directory: Path) -> None:
    """Into ``directory``, the files of a verified checkpoint but its training state and optimizer tensors: the model's
    (and trainer_state.json), which every form of a checkpoint holds as they are (checkpoint_convert)."""
    for name in manifest_files(source):
        if name != STATE_FILE and not name.startswith(OPTIMIZER_DIR + "/"):
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, directory / name)


def _inside(name: str) -> bool:
    """Whether a manifest's file name stays inside the checkpoint (a relative path with no ``..``)."""
    parts = PurePosixPath(name).parts
    return bool(parts) and not name.startswith("/") and ".." not in parts


def load_checkpoint(path: Path, whole: bool = True) -> Payload:
    """(model tensors, training state, trainer state) of a verified checkpoint; ``model_state`` makes the
    tensors a model's state dict. ``whole``: the model and optimizer state whole, read by this one process (a
    sharded checkpoint's optimizer state too); else for a sharded engine whose every rank reads its own part: no
    tensors (its model file is ``path``'s), and an optimizer state that names where each rank reads it from
    (state_io.optimizer_source), the directory of a sharded one or the file of a whole one."""
    trainer_state = verify_checkpoint(path)
    # Memory-mapped: what is not sent on is never read (a sharded engine's ranks map the file for their parts).
    training_state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
    optimizer = training_state.get("optimizer")
    if isinstance(optimizer, dict) and SHARDED in optimizer:
        directory = path.resolve() / optimizer[SHARDED]
        training_state["optimizer"] = (
            read_whole_optimizer(directory, optimizer["param_groups"]) if whole
            else {**optimizer, SHARDED: str(directory)}
        )  # fmt: skip
    elif not whole and optimizer is not None:
        training_state["optimizer"] = {WHOLE_STATE: str(path.resolve() / STATE_FILE)}
    return (read_model_tensors(path) if whole else {}), training_state, trainer_state


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a verified checkpoint, without its training state."""
    verify_checkpoint(path)
    return read_model_tensors(path)


def read_model_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The merged model's tensors and, for a LoRA checkpoint, the rest of the trained model's (peft's names)."""
    tensors = load_file(path / MODEL_FILE)
    if (path / LORA_FILE).exists():
        tensors.update(load_file(path / LORA_FILE))
    return tensors


def adopt(
    run_dir: RunDirectory, trainer_state: dict[str, Any], source: Path, warn: Callable[[str], None], best_needed: bool
) -> bool:
    """The trainer state of ``source``, the checkpoint resumed from, made the run's (``RunDirectory.adopt``); True: the
    run continues in place. ``best_needed`` (--load_best_model_at_end): a best checkpoint that cannot be read now
    would fail the run at its end, after all the training; it is forgotten instead, with a warning, and the best is
    tracked from this run's evaluations."""
    in_place = run_dir.adopt(trainer_state, source)
    best = trainer_state.get("best_model_checkpoint")
    if not best_needed or best is None:
        return in_place
    try:
        verify_checkpoint(run_dir.resolve(best))
    except UsageError as error:
        warn(f"warning: the best checkpoint so far cannot be loaded at the end ({error.problem}): tracking the best "
             "model from this run's evaluations")  # fmt: skip
        trainer_state["best_model_checkpoint"] = trainer_state["best_metric"] = None
    return in_place


def load_resumable(
    spec: str, run_dir: RunDirectory, warn: Callable[[str], None], whole: bool = True
) -> tuple[Path, Payload] | None:
    """The checkpoint ``--resume_from_checkpoint`` names: a directory, or the newest valid one in
    ``run_dir`` (``latest``: one must exist; ``auto``: None if there is none). Newer checkpoints that
    fail verification are reported through ``warn`` and passed over. ``whole``: as ``load_checkpoint``."""
    skipped = []
    for path in run_dir.resumable(spec):
        try:
            return path, load_checkpoint(path, whole)
        except UsageError as error:
            if spec not in (AUTO, LATEST):  # the one named
                raise
            skipped.append(path.name)
            warn(f"warning: passing over {error.problem}")
    if spec == LATEST:
        found = f"none of {', '.join(skipped)} is valid" if skipped else "there is none"
        raise UsageError(
            f"--resume_from_checkpoint latest: no valid checkpoint in {run_dir.path} ({found})",
            "pass an earlier checkpoint directory, or 'auto' to start fresh when there is none",
        )
    return None
