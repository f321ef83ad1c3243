"""How a sharded engine's checkpoint state is written and read (Lightning's CheckpointIO): every rank its own part,
at once, and nobody gathers the whole state.

- The model is ``model.safetensors``, the whole model as every other engine writes it (``from_pretrained`` loads it
  as it is), but each rank writes the rows of its own shards into the one file, at their offsets: rank 0 writes the
  header and sizes the file, then every rank writes in place (``write_model_rows``). A rank resuming reads only the
  rows of its shards (``ModelFile``, memory-mapped).
- The optimizer's tensors are ``optimizer/``, a ``torch.distributed.checkpoint`` (DCP) directory: each rank writes
  its shards (``__<rank>_0.distcp``) and rank 0 the index (``.metadata``). Its keys are ``state.<index>.<name>``
  with the parameters numbered as in torch's optimizer state dict (the order of ``build_optimizer``'s groups, the
  same under every engine), so DCP reshards it to any world size and engine on load (``load_optimizer_shards``),
  and one process reads it whole, one tensor at a time, into torch's format (``read_whole_optimizer``). The groups'
  settings stay in ``training_state.pt`` with a marker (``SHARDED``) naming the directory.

Every rank returns the SHA-256 of the files it wrote (``digests``); rank 0 lists them in the manifest, written
last, so a checkpoint is whole or not at all as before. Every rank must see the checkpoint's directory (a shared
filesystem, as DCP needs).

Saved asynchronously (--save_async, ``BackgroundWrite``), each rank copies its part at the save's step and a thread
writes it while training goes on: the optimizer's through DCP's ``async_save``, the model's rows beside it. The
thread's collectives (DCP's plan and commit, the ranks' digests) run on a Gloo process group of their own, as the
training's own collectives meanwhile run on the default group in another order.
"""

from __future__ import annotations

import errno
import json
import math
import os
import struct
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from horovod_train.common.digest import sha256
from horovod_train.common.files import disk_full

T = TypeVar("T")
OPTIMIZER_DIR = "optimizer"
SHARDED = "sharded_state"  # the key of training_state["optimizer"] that names OPTIMIZER_DIR
WHOLE_STATE = "whole_state_file"  # in a resume's payload: the training_state.pt each rank maps its part of
SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip


# ---- the model: one safetensors file, each rank its own rows ------------------------------------------------------
def rows_of(tensor: torch.Tensor) -> tuple[int, int] | None:
    """The rows [start, stop) of a DTensor's whole tensor that this rank holds (sharded on dim 0 alone, as FSDP2
    shards); None for a plain (replicated) tensor."""
    if not isinstance(tensor, DTensor):
        return None
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    if tuple(shape[1:]) != tuple(tensor.shape[1:]):
        raise ValueError(f"a shard of {tuple(tensor.shape)} split on another dimension than rows: {tuple(shape)}")
    start = offset[0] if shape else 0
    return start, start + (shape[0] if shape else 1)


def first_replica(tensor: torch.Tensor) -> bool:
    """This rank holds the first copy of its rows of a DTensor: its place is 0 on every mesh dimension the tensor is
    replicated over (HSDP's replicas hold the same shards, and one copy of each row is written)."""
    if not isinstance(tensor, DTensor):
        return True
    place = tensor.device_mesh.get_coordinate() or []
    return all(p == 0 for p, placement in zip(place, tensor.placements, strict=True) if placement.is_replicate())


def safetensors_layout(tensors: dict[str, torch.Tensor]) -> tuple[bytes, dict[str, int], int]:
    """The file's header (what ``safetensors`` writes: its length, then JSON padded to 8 bytes), each tensor's
    byte offset in the file, and the file's size, from the whole tensors' shapes and dtypes alone."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    begin = 0
    for name, tensor in tensors.items():
        size = math.prod(tensor.shape) * tensor.dtype.itemsize
        header[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [begin, begin + size]}  # fmt: skip
        begin += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    prefix = struct.pack("<Q", len(text)) + text
    starts = {name: len(prefix) + entry["data_offsets"][0] for name, entry in header.items() if name != "__metadata__"}
    return prefix, starts, len(prefix) + begin


def write_model_rows(
    tensors: dict[str, torch.Tensor], path: Path, is_main: bool, barrier: Callable[[], None],
    background: BackgroundWrite | None = None,
) -> None:  # fmt: skip
    """Collective: ``tensors`` (each rank's state dict: DTensor shards, or plain tensors every rank holds) as one
    safetensors file of the whole tensors. Rank 0 writes the header and plain tensors, every rank its shards' rows
    (HSDP: the first replica's alone, ``first_replica``); the file is complete once every rank has returned (the
    caller's next collective says so), or, ``background``, once every rank's write of the copies taken here is done."""
    prefix, starts, size = safetensors_layout(tensors)
    if is_main:
        with path.open("wb") as f:
            f.write(prefix)
            f.truncate(size)
    barrier()  # the file exists, at its size, before any rank writes into it
    pieces = []  # (offset in the file, this rank's tensor)
    for name, tensor in tensors.items():
        rows = rows_of(tensor)
        if (rows is None and not is_main) or not first_replica(tensor):
            continue
        local = (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach()
        row_bytes = math.prod(tensor.shape[1:]) * tensor.dtype.itemsize
        # Written later: a copy, as training changes the parameters meanwhile.
        offset = starts[name] + (rows[0] * row_bytes if rows else 0)
        pieces.append((offset, local.to("cpu", copy=background is not None)))
    if background is None:
        write_pieces(path, pieces)
    else:
        background.add(lambda: write_pieces(path, pieces))


def write_pieces(path: Path, pieces: list[tuple[int, torch.Tensor]]) -> None:
    with path.open("r+b") as f:
        for offset, tensor in pieces:
            f.seek(offset)
            f.write(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data)
        f.flush()
        os.fsync(f.fileno())


class ModelFile:
    """A checkpoint's ``model.safetensors`` read lazily: a tensor's rows, or the whole of a small one."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> ModelFile:
        self.file = safe_open(str(self.path), framework="pt")
        self.names = set(self.file.keys())
        return self

    def __exit__(self, *exc: object) -> None:
        del self.file

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self.file.get_slice(name)[start:stop]

    def whole(self, name: str) -> torch.Tensor:
        return self.file.get_tensor(name)


def load_model_rows(state: dict[str, torch.Tensor], source: dict[str, torch.Tensor] | ModelFile) -> None:
    """Copy into ``state`` (a sharded model's state dict: its DTensors share the parameters' storage) the rows each
    shard holds, from whole tensors or a checkpoint's file; names ``source`` lacks (a tied copy) are left."""
    with torch.no_grad():
        for name, tensor in state.items():
            if name not in source:
                continue
            rows = rows_of(tensor)
            if rows is None:
                whole = source.whole(name) if isinstance(source, ModelFile) else source[name]
                tensor.copy_(whole)
            else:
                part = source.rows(name, *rows) if isinstance(source, ModelFile) else source[name][rows[0] : rows[1]]
                tensor.to_local().copy_(part.reshape(tensor.to_local().shape))


# ---- the optimizer: a DCP directory ----------------------------------------------------------------------------
def parameter_indices(optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """id(parameter) -> its number in torch's optimizer state dict (the groups' order)."""
    return {id(p): i for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"])}


def param_groups(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The groups as torch's ``state_dict`` holds them: the settings, the parameters by number."""
    indices = parameter_indices(optimizer)
    return [{**{k: v for k, v in group.items() if k != "params"}, "params": [indices[id(p)] for p in group["params"]]}
            for group in optimizer.param_groups]  # fmt: skip


def optimizer_marker(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """A sharded checkpoint's ``training_state["optimizer"]``: the groups (torch's form), and the tensors'
    directory."""
    return {"param_groups": groups, SHARDED: OPTIMIZER_DIR}


def flat_state(state: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """{index: {name: value}} as DCP's keys, ``state.<index>.<name>``."""
    return {f"state.{index}.{name}": value for index, entry in state.items() for name, value in entry.items()}


def nested_state(flat: dict[str, Any]) -> dict[int, dict[str, Any]]:
    nested: dict[int, dict[str, Any]] = {}
    for key, value in flat.items():
        _, index, name = key.split(".", 2)
        nested.setdefault(int(index), {})[name] = value
    return nested


def save_optimizer_shards(
    state: dict[Any, dict[str, Any]], directory: Path, background: BackgroundWrite | None = None
) -> None:
    """Collective: this rank's part of the optimizer's state (DTensor shards, or the whole tensors of the parameters
    it steps), each rank's files at once; ``background``: copied here (DCP's ``async_save`` stages it), written by
    DCP's thread, waited for by the background write's. A failure is every rank's (DCP gathers them) and an
    Exception: DCP's CheckpointException is a BaseException, which would pass every handler; a full disk is an
    OSError of ENOSPC."""
    flat = flat_state(state)
    writer = dcp.FileSystemWriter(directory)
    if background is None:
        reporting_dcp_failures(flat, directory, lambda: dcp.save(flat, storage_writer=writer))
        return
    saving = dcp.async_save(flat, storage_writer=writer, process_group=background.group)
    background.add(lambda: reporting_dcp_failures(flat, directory, saving.result))


def reporting_dcp_failures(flat: dict[str, Any], directory: Path, save: Callable[[], Any]) -> None:
    """``save`` (DCP's, of ``flat`` into ``directory``) with its failure an Exception, ENOSPC where it was a full
    disk (save_optimizer_shards)."""
    try:
        save()
    except CheckpointException as error:
        # The writer's OSError does not travel with DCP's gathered errors (torch.save reports "unexpected pos"):
        # the disk was full where less space is left than this rank's shards take.
        local = [v.to_local() if isinstance(v, DTensor) else v for v in flat.values() if torch.is_tensor(v)]
        needed = sum(t.numel() * t.element_size() for t in local)
        stats = os.statvfs(directory.parent)
        if stats.f_bavail * stats.f_frsize < needed:
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} writing {directory}") from None
        raise RuntimeError(str(error)) from None


def saved_entries(directory: Path) -> Iterator[tuple[str, int, str, Any]]:
    """(key, parameter number, state name, metadata) of every entry of a DCP optimizer directory."""
    metadata = dcp.FileSystemReader(directory).read_metadata()
    for key, item in metadata.state_dict_metadata.items():
        _, index, name = key.split(".", 2)
        yield key, int(index), name, item


def optimizer_source(state: dict[str, Any]) -> dict[str, Any]:
    """A resume's optimizer state as a sharded engine loads it: a whole one that names its file memory-mapped
    (each rank's copy of its shards reads only their pages), else as it is (whole, or naming its DCP directory)."""
    if WHOLE_STATE not in state:
        return state
    return torch.load(state[WHOLE_STATE], map_location="cpu", weights_only=True, mmap=True)["optimizer"]


def empty_like_saved(item: Any, like: torch.Tensor | None) -> Any:
    """Room for a saved entry: a DTensor sharded as its parameter ``like`` where it has the parameter's shape, a
    whole tensor otherwise; None for a non-tensor (DCP fills it)."""
    if not isinstance(item, TensorStorageMetadata):
        return None
    if like is not None and isinstance(like, DTensor) and tuple(item.size) == tuple(like.shape):
        return torch.empty_like(like, dtype=item.properties.dtype)
    device = like.device if like is not None and tuple(item.size) == tuple(like.shape) else "cpu"
    return torch.empty(tuple(item.size), dtype=item.properties.dtype, device=device)


def load_optimizer_shards(
    directory: Path, params: list[torch.Tensor], wanted: Callable[[int], bool] = lambda index: True
) -> dict[int, dict[str, Any]]:
    """Collective: the saved state of the parameters this rank steps (``wanted`` by number; ``params``: every
    parameter by number), each read into its shards or whole, resharded from however many ranks saved it."""
    state = {key: empty_like_saved(item, params[index])
             for key, index, _, item in saved_entries(directory) if wanted(index)}  # fmt: skip
    dcp.load(state, storage_reader=dcp.FileSystemReader(directory))
    return nested_state(state)


def read_whole_optimizer(directory: Path, groups: list[dict[str, Any]]) -> dict[str, Any]:
    """One process (no process group): the whole optimizer state in torch's format, each tensor read once."""
    state = {key: empty_like_saved(item, None) for key, _, _, item in saved_entries(directory)}
    with warnings.catch_warnings():  # that one process reads it is the intent, which DCP warns it assumes
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, storage_reader=dcp.FileSystemReader(directory), no_dist=True)
    return {"state": nested_state(state), "param_groups": groups}


def write_whole_optimizer(state: dict[Any, dict[str, Any]], directory: Path) -> None:
    """One process (no process group): a whole optimizer state as a sharded checkpoint's directory, which DCP
    reshards to any world size on load."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save(flat_state(state), storage_writer=dcp.FileSystemWriter(directory), no_dist=True)


def on_every_rank(gather: Callable[[Any], list[Any]], work: Callable[[], T]) -> T:
    """``work`` on every rank; where it fails on any rank, every rank raises (rather than wait for the failed one in
    the next collective): the failed rank its own error, the others one that names it, an OSError of the same
    errno where it was a full disk (so that every rank reports it as one: checkpoint.refusing_a_full_disk)."""
    failure: Exception | None = None
    try:
        result = work()
    except Exception as error:
        failure = error
    problems = gather(None if failure is None else [f"{type(failure).__name__}: {failure}", disk_full(failure)])
    failed = [(rank, problem) for rank, problem in enumerate(problems) if problem]
    if not failed:
        return result
    # A full disk first: a collective's failure (DCP's) reaches every rank, the cause only the rank that met it.
    rank, (text, full) = min(failed, key=lambda item: item[1][1] is None)
    if failure is not None and (disk_full(failure) or not full):
        raise failure
    message = f"rank {rank} failed to write its part of the checkpoint: {text}"
    raise OSError(full, message) from failure if full else RuntimeError(message)


def digests(directory: Path, names: list[Path]) -> dict[str, str]:
    """{path inside the checkpoint: SHA-256} of the files this rank wrote."""
    return {path.relative_to(directory).as_posix(): sha256(path) for path in names}


def written_digests(directory: Path, rank: int, background: BackgroundWrite | None = None) -> dict[str, str]:
    """Engine.save_state_shards' answer: ``digests`` of what ``rank`` wrote; with ``background``, {} now (nothing is
    written yet): the background write computes them once it has written (``BackgroundWrite.start``)."""
    return {} if background is not None else digests(directory, written_by(directory, rank))


def written_by(directory: Path, rank: int) -> list[Path]:
    """The files DCP wrote for ``rank`` in an optimizer directory (rank 0: the index too)."""
    found = sorted((directory / OPTIMIZER_DIR).glob(f"__{rank}_*.distcp"))
    return found + ([directory / OPTIMIZER_DIR / ".metadata"] if rank == 0 else [])


# ---- saves beside training (--save_async) -------------------------------------------------------------------------
class BackgroundWrite:
    """One rank's part of an asynchronous save: Engine.save_state_shards stages this rank's state (copies it at the
    save's step) and ``add``s its writes; ``start`` runs them in a thread while training goes on. ``group``: the
    Gloo process group of its collectives (DCP's async_save needs one with a CPU backend; their own, as training's
    collectives run meanwhile), the engine's (ProcessGroupEngine.background_write)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.jobs: list[Callable[[], Any]] = []

    def add(self, job: Callable[[], Any]) -> None:
        self.jobs.append(job)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` on every rank, over the background group."""
        gathered: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(gathered, obj, group=self.group)
        return gathered

    def start(self, directory: Path, rank: int, then: Callable[[dict[str, str]], T]) -> Future[T]:
        """Write; once every rank has written its files (a failure on any rank is every rank's, as on_every_rank),
        ``then`` (rank 0: complete the checkpoint) with {file: SHA-256} of every rank's. The future's result is
        ``then``'s."""

        def write_mine() -> dict[str, str]:
            for job in self.jobs:
                job()
            return digests(directory, written_by(directory, rank))

        def write() -> T:
            written = on_every_rank(self.gather, write_mine)
            return then({name: digest for part in self.gather(written) for name, digest in part.items()})

        executor = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-write")
        try:
            return executor.submit(write)
        finally:
            executor.shutdown(wait=False)  # the thread ends with the write
