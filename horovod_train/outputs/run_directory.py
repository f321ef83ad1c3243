"""The run directory (``--output_dir``): the one owner of what a run may write, where, and when.

Every path that writes under ``--output_dir`` goes through a ``RunDirectory``: the check before the run, the
lock, the ledger, the reset, the names of its files and checkpoints, rotation's and the best checkpoint's view of
which checkpoints are the run's own. The rules (docs/failures.md, "The run directory"):

- **One job per directory.** Rank 0 holds an advisory ``flock`` on ``.horovod-train.lock`` for the whole run, with
  its host and pid inside for the message a second job gets. The lock is taken before the directory is judged, so
  a second job is told "in use by another job", not what the first one has written so far. The kernel drops it
  when its holder exits, however it exits.
- **The ledger** (``.horovod-train-outputs.json``): every top-level name this project wrote in the directory,
  recorded before the file is written; a checkpoint is the project's while it holds only what its manifest lists
  (``unlisted``). ``--overwrite_output_dir`` removes those, the project's checkpoints and its
  crash leftovers, and nothing else; a directory that holds anything else is refused instead.
- **No run inside another.** An ``--output_dir`` inside a checkpoint or another run's directory is refused (that
  run's rotation or reset would delete it), except under a name compare or bench recorded for its jobs.
- **A run starts fresh or continues in place.** It continues in place when it resumes from a checkpoint inside the
  directory (``auto``, ``latest``, or a ``checkpoint-<step>`` directly in it): nothing is removed, and rotation
  deletes only checkpoints of the run's own lineage. Every other start is fresh (no resume, or a checkpoint from
  elsewhere, which is input: read, never written, rotated or deleted): the directory must be empty or, with
  ``--overwrite_output_dir``, hold only this project's outputs, which are removed once every input was checked.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from horovod_train.common.errors import UsageError
from horovod_train.common.files import atomic_file, follow_umask, write_json_atomic
from horovod_train.config.domains import writable_below
from horovod_train.outputs.checkpoint_layout import (
    AUTO,
    LATEST,
    MANIFEST,
    NAME,
    PREFIX,
    STALE,
    TRAINER_FILE,
)


class RunFiles:
    """The names of what a run writes at the top of its directory, spelled here alone: everything else asks the
    ``RunDirectory`` for its files (the names of checkpoints and of what they hold are checkpoint_layout's)."""

    LOCK = ".horovod-train.lock"
    LEDGER = ".horovod-train-outputs.json"
    CONFIG = "run_config.json"  # this attempt's configuration: an elastic worker recognises its job by it
    METRICS = "metrics.jsonl"
    TRAIN_RESULTS = "train_results.json"
    EVAL_RESULTS = "eval_results.json"
    TRAINER_STATE = TRAINER_FILE
    FINISHED = "all_results.json"  # written last by a run that finished
    PREDICTIONS = "predict_results{}.txt"  # run_glue's: {} is empty for the test split, else _<its suffix>
    TRAINING_CURVES = "training_curves.png"
    MODEL_CARD = "README.md"  # as transformers' Trainer names it

    @classmethod
    def predictions(cls, split: str) -> str:
        return cls.PREDICTIONS.format("" if split == "test" else f"_{split.removeprefix('test_')}")

    @classmethod
    def outputs(cls) -> str:
        """A pattern of the names above that a run writes (not the lock, nor the ledger)."""
        names = (cls.CONFIG, cls.METRICS, cls.TRAIN_RESULTS, cls.EVAL_RESULTS, cls.TRAINER_STATE, cls.FINISHED,
                 cls.TRAINING_CURVES, cls.MODEL_CARD)  # fmt: skip
        return "|".join([*map(re.escape, names), ".*".join(map(re.escape, cls.PREDICTIONS.split("{}")))])


TEMPORARY = re.compile(r"\.(?P<name>.+)\.[^.]+\.tmp")  # files.atomic_file's temporaries
# The top-level names a run may write: its own files, save_pretrained's model and tokenizer files, the trackers'
# directories (and lora's adapter). A file of another origin under one of these names would be replaced, so even a
# run that continues in place refuses it (one under any other name, a SLURM log say, is left alone).
RUN_OUTPUTS = re.compile(
    RunFiles.outputs()
    + r"""|adapter|runs|wandb
    |(generation_)?config\.json|model.*\.safetensors(\.index\.json)?|pytorch_model.*\.bin(\.index\.json)?
    |tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab\..*|merges\.txt|.*\.model|chat_template\..*""",
    re.VERBOSE,
)


def clean_stale(output_dir: Path) -> None:
    """Remove what crashed writes left: temporary checkpoints, and replaced ones whose successor is in
    place (a replaced one whose successor never arrived is put back)."""
    if not output_dir.is_dir():
        return
    for path in output_dir.iterdir():
        if not STALE.fullmatch(path.name):
            continue
        original = output_dir / path.name[1 : -len(".previous")] if path.name.endswith(".previous") else None
        if original is not None and not original.exists():
            os.rename(path, original)
        else:
            shutil.rmtree(path, ignore_errors=True)


def saved_state(checkpoint: Path) -> dict:
    """A checkpoint's trainer state as written, unverified ({} where unreadable): enough to order checkpoints."""
    try:
        state = json.loads((checkpoint / TRAINER_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def unlisted(checkpoint: Path) -> list[str] | None:
    """What a checkpoint folder holds besides the files its manifest lists (a run's directory made inside it, a
    user's file), by relative path, a folder once, sorted; None where it has no readable manifest (not a
    checkpoint). Only a checkpoint with nothing unlisted is this project's to delete whole: its name and its
    manifest say who made the folder, not who put things in it since. Nothing else is allowed inside: a checkpoint
    is written whole in a temporary folder and renamed into place, so it holds no temporaries of its own."""
    try:
        manifest = json.loads((checkpoint / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    files = {*map(str, manifest), MANIFEST}
    folders = {parent.as_posix() for name in files for parent in PurePosixPath(name).parents} - {"."}
    found: list[str] = []

    def inside(path: str | os.PathLike) -> str:
        return Path(path).relative_to(checkpoint).as_posix()

    def unreadable(error: OSError) -> None:  # a folder whose content is unknown counts as unlisted
        found.append(inside(error.filename))

    for root, dirs, names in os.walk(checkpoint, onerror=unreadable):
        for name in list(dirs):
            if inside(Path(root, name)) not in folders or Path(root, name).is_symlink():
                found.append(inside(Path(root, name)))
                dirs.remove(name)  # reported once, not descended
        found += [inside(Path(root, name)) for name in names if inside(Path(root, name)) not in files]
    return sorted(found)


def named_checkpoint(spec: str) -> Path:
    """The directory ``--resume_from_checkpoint`` names (not auto or latest), which must exist."""
    path = Path(spec)
    if not path.is_dir():
        raise UsageError(
            f"--resume_from_checkpoint {spec} does not exist", "pass a checkpoint-<step> directory, 'latest' or 'auto'"
        )
    return path


def entries(path: Path) -> set[str]:
    """The directory's top-level names, less the lock file (a killed holder leaves it behind)."""
    return {p.name for p in path.iterdir()} - {RunFiles.LOCK} if path.is_dir() else set()


def read_ledger(path: Path) -> dict:
    try:
        ledger = json.loads((path / RunFiles.LEDGER).read_text())
        return ledger if isinstance(ledger, dict) and isinstance(ledger.get("entries"), list) else {"entries": []}
    except (OSError, ValueError):
        return {"entries": []}


def recorded(path: Path) -> set[str]:
    return set(map(str, read_ledger(path)["entries"]))


def is_own(path: Path, name: str, ledger: set[str]) -> bool:
    """Written by this project: in the ledger, a checkpoint holding only what its manifest lists (as set aside
    for its replacement, too), or a leftover of our writes."""
    if name in ledger or name == RunFiles.LEDGER:
        return True
    if NAME.fullmatch(name) or (STALE.fullmatch(name) and name.endswith(".previous")):
        return unlisted(path / name) == []
    if STALE.fullmatch(name):  # a checkpoint's temporary folder, killed before its manifest was written
        return True
    temporary = TEMPORARY.fullmatch(name)
    return temporary is not None and temporary["name"] in ledger


def described(path: Path, name: str) -> str:
    """A foreign name as a refusal shows it: in a checkpoint, what its manifest does not list, or that it has none
    (a checkpoint is renamed into place with its manifest: one without was never complete, or not this project's)."""
    if not NAME.fullmatch(name):
        return name
    extra = unlisted(path / name)
    if extra is None:
        return f"{name} (no readable {MANIFEST}: not a complete checkpoint of this project)"
    return ", ".join(f"{name}/{inside}" for inside in extra[:3]) if extra else name


def foreign_entries(path: Path) -> list[str]:
    """What this project did not write in ``path``, sorted."""
    ledger = recorded(path)
    return sorted(name for name in entries(path) if not is_own(path, name, ledger))


def refuse_foreign(path: Path, flag: str) -> None:
    foreign = foreign_entries(path)
    if foreign:
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        shown = ", ".join(described(path, name) for name in foreign[:5]) + more
        raise UsageError(
            f"--output_dir {path} holds files this project did not write ({shown}), which {flag} would not remove",
            "give the run a directory of its own (e.g. a new subdirectory), or move those files out",
        )


def record(path: Path, *names: str, holds_runs: bool = False) -> None:
    """Add ``names`` to the ledger (rank 0 only). ``holds_runs``: the directory of a command that runs training
    jobs in some of them (compare, bench): a run may have its --output_dir inside one of those names."""
    ledger = read_ledger(path)
    entries, runs_below = set(map(str, ledger["entries"])), ledger.get("holds_runs") is True or holds_runs
    if not set(names) <= entries or runs_below != (ledger.get("holds_runs") is True):
        data = {"written_by": "horovod-train", "entries": sorted(entries | set(names))}
        write_json_atomic(path / RunFiles.LEDGER, {**data, **({"holds_runs": True} if runs_below else {})})


def stamps(path: Path) -> dict[str, tuple[int, int, int]]:
    """Each top-level name's (inode, mtime, size): a file replaced or rewritten in place changes one of them."""
    found = {}
    for name in entries(path) - {RunFiles.LEDGER}:
        with contextlib.suppress(FileNotFoundError):
            stat = (path / name).lstat()
            found[name] = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    return found


@contextlib.contextmanager
def recording(path: Path) -> Iterator[set[str]]:
    """Record every top-level name the block creates or rewrites in ``path`` (writers that choose their own file
    names: save_pretrained, the trackers). Yields the set of those names, filled when the block ends: what the
    block wrote, not what was there before (a user's file beside the run's is in it only if the block wrote it)."""
    before, created = stamps(path), set()
    try:
        yield created
    finally:
        created |= {name for name, stamp in stamps(path).items() if before.get(name) != stamp}
        if created:
            record(path, *created)


def check_usable(path: Path) -> None:
    """What any run needs of the path, whatever the directory holds."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"--output_dir {path} is a file", "pass a directory path")
    writable_below("output_dir", str(path), path)
    refuse_nested(path)


def refuse_nested(path: Path) -> None:
    """An --output_dir inside a checkpoint or another run's directory: that run's --overwrite_output_dir or rotation
    would delete it, with all of this run in it. Below the directory of a command that runs jobs (compare, bench),
    a run belongs in one of the names it recorded for them."""
    try:
        target = path.resolve()
    except (OSError, RuntimeError):  # a symbolic link loop: writable_below names it
        target = path.absolute()
    for ancestor in target.parents:
        if NAME.fullmatch(ancestor.name) and (ancestor / MANIFEST).is_file():
            raise UsageError(
                f"--output_dir {path} lies inside the checkpoint {ancestor}, which that run's rotation or "
                "--overwrite_output_dir would delete with this run in it",
                "give the run a directory outside that run's (e.g. a sibling of it)",
            )
        if not ((ancestor / RunFiles.LEDGER).is_file() or (ancestor / RunFiles.LOCK).exists()):
            continue
        ledger, below = read_ledger(ancestor), target.relative_to(ancestor).parts[0]
        if ledger.get("holds_runs") is True and below in ledger["entries"]:
            return  # a job of compare's or bench's; what lies above that directory is its to check
        raise UsageError(
            f"--output_dir {path} lies inside {ancestor}, the directory of another run, whose "
            "--overwrite_output_dir would delete it with this run in it",
            "give the run a directory outside that run's (e.g. a sibling of it)",
        )


def refuse_clashes(path: Path) -> None:
    """Files this project did not write under a name the run writes (a run that continues in place): its outputs,
    and a checkpoint's (rotation deletes one, a save of the same step replaces it)."""
    clashes = [
        name for name in foreign_entries(path) if RUN_OUTPUTS.fullmatch(name) or NAME.fullmatch(name)
        or STALE.fullmatch(name)
    ]  # fmt: skip
    if clashes:
        raise UsageError(
            f"--output_dir {path} holds {', '.join(described(path, name) for name in clashes[:5])}, which this project "
            "did not write and the run would replace or delete",
            "move those files out of the run's directory",
        )


def check_fresh(path: Path, overwrite: bool, resume: str | None = None, reads: dict[str, str] | None = None) -> None:
    """A fresh run may use the directory: empty, or with --overwrite_output_dir only this project's outputs.
    ``resume``: a checkpoint of another directory, which starts the run fresh here; ``reads``: the run's other inputs
    by flag (RunDirectory's)."""
    if not entries(path):
        return
    if resume is not None and _inside(Path(resume), path):
        raise UsageError(
            f"--resume_from_checkpoint {resume} lies inside --output_dir {path}, which a fresh start empties "
            "(a run continues in place only from a checkpoint-<step> directly in it)",
            "resume from a copy of that checkpoint outside the directory, or choose another --output_dir",
        )
    refuse_reads_inside(path, reads or {})
    refuse_foreign(path, "--overwrite_output_dir")
    if not overwrite:
        elsewhere = f" (a resume from {resume}, another directory's checkpoint, starts a new run)" if resume else ""
        raise UsageError(
            f"--output_dir {path} already holds files of an earlier run{elsewhere}",
            "pass --overwrite_output_dir to replace them, or choose another --output_dir",
        )


def refuse_reads_inside(path: Path, reads: dict[str, str]) -> None:
    """A model, config or tokenizer the run reads from the directory a fresh start empties (a checkpoint of an
    earlier run there, or its final model): the reset used to delete it once the run had loaded it, and the run's
    run_config.json then named a path that holds the new run's files."""
    for flag, value in reads.items():
        read = Path(value)
        if read.exists() and (_same_dir(read, path) or _inside(read, path)):
            where = "is" if _same_dir(read, path) else "lies inside"
            raise UsageError(
                f"{flag} {value} {where} --output_dir {path}, which a fresh start empties",
                f"copy it out of {path} and pass the copy, or choose another --output_dir",
            )


def reset(path: Path) -> None:
    """Remove this project's outputs from the directory and its ledger (only called after every input was
    validated, with the lock held). Anything else stays: the checks refused it earlier."""
    path.mkdir(parents=True, exist_ok=True)
    ledger = recorded(path)
    for name in sorted(entries(path)):
        if not is_own(path, name, ledger):
            continue
        child = path / name
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


class OutputDirLock:
    """Rank 0's exclusive, advisory hold on an output directory for one run."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.path = output_dir / RunFiles.LOCK
        self.fd: int | None = None
        self.created: list[Path] = []  # directories made to hold the lock, removed again if the run wrote nothing

    def acquire(self) -> None:
        missing = self.output_dir
        while not missing.exists():
            self.created.insert(0, missing)
            missing = missing.parent
        self.output_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self.release()
                raise UsageError(
                    f"--output_dir {self.output_dir} is in use by another job ({self.holder()})",
                    "wait for that job to end, or choose another --output_dir",
                ) from None
            # The holder unlinks the file when it releases: a lock on an unlinked file locks nothing.
            if self._still_linked(fd):
                break
            os.close(fd)
        self.fd = fd
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(holder) + "\n").encode())

    def _open(self) -> int:
        """The lock file, opened for writing. One left by a killed job of another user (not writable to us) is
        stale if nobody holds it: it is replaced, which needs only the directory's write permission."""
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            pass
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:  # its holder released it meanwhile
            return self._open()
        except PermissionError:
            fd = None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return fd  # held: acquire() reports its holder
            os.close(fd)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except PermissionError:
            raise UsageError(
                f"--output_dir {self.output_dir} has a lock file {RunFiles.LOCK} of another user that this user "
                "can neither open nor replace",
                f"remove {self.path} once no job of that user runs there, or choose another --output_dir",
            ) from None
        return self._open()

    def _still_linked(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def holder(self) -> str:
        try:
            found = json.loads(self.path.read_text())
            return f"pid {found['pid']} on {found['host']}, since {found['since']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "holder unknown"

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)  # closing drops the flock
            self.fd = None
        for directory in reversed(self.created):
            with contextlib.suppress(OSError):
                directory.rmdir()  # only if empty: the run wrote nothing there
        self.created = []


class RunDirectory:
    """One training run's ``--output_dir``. Rank 0 calls ``claim`` first thing in setup, ``begin`` once every
    input was checked, then writes only through ``file``, ``recording`` and ``checkpoint``."""

    def __init__(self, path: str | Path, reads: dict[str, str] | None = None) -> None:
        self.path = Path(path)
        # The run's inputs by flag (--model_name_or_path, ...): a fresh start must not empty a directory holding one.
        self.reads = reads or {}
        self.lock = OutputDirLock(self.path)
        # The top-level names this process wrote, in order: those it recorded in the ledger, and its checkpoints.
        self.written: dict[str, None] = {}

    # ---- where a checkpoint lies -------------------------------------------------------------
    def holds(self, checkpoint: Path) -> bool:
        """The checkpoint is one of this directory's own (a ``checkpoint-<step>`` directly in it)."""
        return NAME.fullmatch(checkpoint.name) is not None and _same_dir(checkpoint.parent, self.path)

    def continues(self, resume: str | None) -> bool:
        """The run resumes in place: from the newest checkpoint here (auto, latest) or from one of its own."""
        return resume in (AUTO, LATEST) or (resume is not None and self.holds(Path(resume)))

    def checkpoint(self, step: int) -> Path:
        return self.path / f"{PREFIX}{step}"

    def checkpoints(self) -> list[Path]:
        """Its complete checkpoints (renamed into place), oldest saved first (by save order, then step)."""
        if not self.path.is_dir():
            return []
        found = [p for p in self.path.iterdir() if p.is_dir() and NAME.fullmatch(p.name)]
        return sorted(found, key=lambda p: (saved_state(p).get("save_sequence", 0), int(p.name[len(PREFIX) :])))

    def resumable(self, spec: str) -> list[Path]:
        """What ``--resume_from_checkpoint`` names, to try newest first: a checkpoint directory (which must exist), or
        for ``auto`` and ``latest`` this directory's own."""
        return list(reversed(self.checkpoints())) if spec in (AUTO, LATEST) else [named_checkpoint(spec)]

    def resolve(self, reference: str) -> Path:
        """A checkpoint a run state names: a bare name is this directory's own (it moves with the directory);
        an absolute path is a checkpoint elsewhere that a fresh run resumed from (see ``adopt``)."""
        path = Path(reference)
        return path if path.is_absolute() and not _same_dir(path.parent, self.path) else self.path / path.name

    def adopt(self, trainer_state: dict[str, Any], source: Path) -> bool:
        """The trainer state of ``source`` (the checkpoint resumed from), made this run's: the lineage of another
        directory's checkpoint is not this run's to rotate, and the best checkpoint is named as this run refers to
        it. True: the run continues in place (``source`` is one of its own)."""
        in_place = self.holds(source)
        if not in_place:
            trainer_state["lineage"] = []
        best = trainer_state.get("best_model_checkpoint")
        if best is not None:
            found = Path(best)
            origin = found if found.is_absolute() else source.parent / found.name
            best = found.name if self.holds(origin) else str(origin.absolute())
        trainer_state["best_model_checkpoint"] = best
        return in_place

    # ---- the run's life ----------------------------------------------------------------------
    def claim(self, overwrite: bool, resume: str | None) -> None:
        """Rank 0, before anything reads or writes the directory: usable, locked, and (for a fresh start)
        empty or holding only what --overwrite_output_dir may remove. Refused: released, nothing written."""
        self.check_inputs(resume)
        self.lock.acquire()
        try:
            self.judge(overwrite, resume)
            if self.continues(resume):
                clean_stale(self.path)  # what a crash of this run left: temporaries, a checkpoint set aside
        except BaseException:
            self.lock.release()
            raise

    def refuse_early(self, overwrite: bool, resume: str | None) -> None:
        """``claim``'s refusals, without the lock and without writing: a one-process run asks before it loads
        torch (cli.refuse_output_dir_early), so that a refused directory costs a second. ``claim`` still judges
        under the lock. A lock file there may be a running job's, whose "in use" is ``claim``'s to say: the
        directory is not judged."""
        self.check_inputs(resume)
        if not (self.path / RunFiles.LOCK).exists():
            self.judge(overwrite, resume)

    def check_inputs(self, resume: str | None) -> None:
        check_usable(self.path)
        if resume not in (None, AUTO, LATEST):
            named_checkpoint(resume)  # a wrong path is the first thing to hear about

    def judge(self, overwrite: bool, resume: str | None) -> None:
        """What the directory holds, for a run that continues in place or one that starts fresh."""
        if self.continues(resume):
            refuse_clashes(self.path)
        else:
            check_fresh(self.path, overwrite, resume, self.reads)

    def check_start_over(self, overwrite: bool) -> None:
        """``auto`` found no valid checkpoint here: start over only where that loses nothing (an empty
        directory, or an unfinished earlier attempt of this project) or with --overwrite_output_dir."""
        if not self.path.is_dir():
            return
        refuse_reads_inside(self.path, self.reads)
        refuse_foreign(self.path, "starting over")
        if not overwrite and (self.path / RunFiles.FINISHED).exists():
            raise UsageError(
                f"--output_dir {self.path} holds a finished run ({RunFiles.FINISHED}) and no valid checkpoint to "
                "resume",
                "pass --overwrite_output_dir to replace it, or choose another --output_dir",
            )

    def begin(self, fresh: bool) -> None:
        """Every input was validated: a fresh run removes an earlier run's outputs (the checks allowed only
        this project's); one that continues keeps everything."""
        if fresh:
            reset(self.path)
            self.written.clear()
        self.path.mkdir(parents=True, exist_ok=True)

    def file(self, name: str) -> Path:
        """The path of a top-level output, recorded in the ledger before it is written."""
        if name not in self.written:
            record(self.path, name)
            self.written[name] = None
        return self.path / name

    @contextlib.contextmanager
    def recording(self) -> Iterator[set[str]]:
        """The module's ``recording`` (it yields what the block wrote, filled when it ends), and the names it saw
        remembered as this run's."""
        created: set[str] = set()
        try:
            with recording(self.path) as created:
                yield created
        finally:
            self.written.update(dict.fromkeys(sorted(created)))

    def write_outputs(
        self, files: dict[str, str | bytes | dict], save: Callable[[Path], object], widen: Iterable[str] = ()
    ) -> None:
        """The run's files at its end (rank 0), in one place: what ``save`` writes under names of its own (the
        tokenizer's save_pretrained), then ``files`` in their order, each whole (a dict as JSON), the last one
        marking a finished run; ``widen``: files written earlier whose writer ignored the umask (safetensors writes
        0600), given the modes a plain open() would."""
        with self.recording():
            save(self.path)
            for name, content in files.items():
                if isinstance(content, dict):
                    write_json_atomic(self.path / name, content)
                    continue
                with atomic_file(self.path / name, "wb" if isinstance(content, bytes) else "w") as f:
                    f.write(content)
        for name in widen:
            follow_umask(self.path / name)

    def remove_checkpoint(self, name: str) -> None:
        """Rotation's deletion of one of its checkpoints: whole, unless it holds what its manifest does not list
        (put there since it was written), which is left as it is."""
        if unlisted(self.path / name) == []:
            shutil.rmtree(self.path / name, ignore_errors=True)

    def wrote_checkpoint(self, checkpoint: Path) -> None:
        """A checkpoint of this run's (its manifest, not the ledger, marks it as the project's)."""
        self.written[checkpoint.name] = None

    def write_config(self, config: dict[str, Any]) -> None:
        """This attempt's configuration, resumed or not: a worker added later recognises its job by it."""
        path = self.file(RunFiles.CONFIG)  # recorded in the ledger first
        write_json_atomic(path, config)

    def read_config(self) -> dict[str, Any]:
        """The configuration the latest attempt here wrote ({} where there is none)."""
        return _read_json(self.path / RunFiles.CONFIG) or {}

    def read_finished(self, global_step: int | None = None) -> dict[str, Any] | None:
        """The results of a run that finished here (its last file written; at ``global_step`` if one is given),
        else None."""
        results = _read_json(self.path / RunFiles.FINISHED)
        return results if results is not None and global_step in (None, results.get("global_step")) else None

    def read_metrics(self) -> list[dict[str, Any]]:
        """The records the run logged (--logging_steps), in order."""
        return [json.loads(line) for line in (self.path / RunFiles.METRICS).read_text().splitlines() if line]

    def run_name(self, given: str | None) -> str:
        """What trackers and the model card call the run: --run_name, else the directory's name."""
        return given or self.path.resolve().name

    def outputs(self) -> list[str]:
        """What this process wrote that is still there (rotation removes checkpoints), directories with a ``/``."""
        present = [name for name in self.written if (self.path / name).exists()]
        return [f"{name}/" if (self.path / name).is_dir() else name for name in present]

    def release(self) -> None:
        self.lock.release()


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object's file, or None where it is missing, unreadable or not an object."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _inside(path: Path, directory: Path) -> bool:
    try:
        return directory.resolve() in path.resolve().parents
    except OSError:
        return directory.absolute() in path.absolute().parents


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a.absolute() == b.absolute()


@contextlib.contextmanager
def claimed(output_dir: str, overwrite: bool, outputs: list[str]) -> Iterator[Path]:
    """For a command that fills a directory itself (compare, bench train): checked, locked, emptied of an
    earlier run's outputs, with the names it will write recorded up front (a killed run leaves them own)."""
    run_dir = RunDirectory(output_dir)
    run_dir.claim(overwrite, resume=None)
    try:
        run_dir.begin(fresh=True)
        record(run_dir.path, *outputs, holds_runs=True)
        yield run_dir.path
    finally:
        run_dir.release()
