"""Where a run's examples come from, read as given (before any column or label is checked): local files
(.csv, .tsv, .json, .jsonl, .parquet, through the ``datasets`` builders and an Arrow cache), synthetic-nli,
and the hub or save_to_disk directories of GLUE and other datasets (horovod_train/data/glue.py)."""

from __future__ import annotations

import codecs
import csv
import itertools
import json
import logging
import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
from datasets import ClassLabel, Dataset

from horovod_train.common.errors import UsageError
from horovod_train.config import domains
from horovod_train.config.run_config import DataArguments
from horovod_train.data import glue, glue_files, synthetic
from horovod_train.data.columns import LABEL_COLUMN

SYNTHETIC = "synthetic-nli"
FILE_SEPARATORS = {".csv": ",", ".tsv": "\t"}
Splits = dict[str, Dataset]


def default_cache_dir() -> Path:
    return Path(os.environ.get("HOROVOD_TRAIN_CACHE", Path.home() / ".cache" / "horovod-train"))


def read_file(path: str, flag: str, cache_dir: Path, task_name: str | None = None) -> Dataset:
    """A data file as a memory-mapped Dataset, through the ``datasets`` builder of its format (an Arrow copy
    cached under ``cache_dir``/files, built once: each node's local main rank reads first, see
    training/build.py). A file the builder refuses, or one without rows, is read again in memory as before,
    for its exact message (or its rows: pandas also reads a CSV whose chunks infer other types)."""
    domains.data_file(flag.removeprefix("--"), path)  # as the arguments were checked: it may be gone since
    file = Path(path)
    suffix = file.suffix.lower()
    names = glue_files.headerless_columns(task_name, file)
    if suffix == ".json":
        _check_json_rows(file, flag, whole=False)
    dataset = _build(file, names, cache_dir)
    if dataset is None:
        dataset = _read_into_memory(file, flag, names)
    if len(dataset) == 0:  # a header alone, or [] (an empty test split would predict nothing)
        raise UsageError(
            f"{flag} {path} has no examples",
            "add examples to it, or drop --test_file" if flag == "--test_file" else "add examples to it",
        )
    if suffix == ".json" and len(dataset) == 1:  # one object read as one row (as JSON Lines are)
        _check_json_rows(file, flag, whole=True)
    if suffix == ".tsv":
        _check_one_row_per_line(file, len(dataset), flag, header=names is None)
    if suffix in FILE_SEPARATORS and any(column.null_count for column in dataset.data.columns):
        _check_fields_per_line(file, flag, names)  # pandas fills a short line's missing fields with nulls
    return glue_files.without_bom(dataset)


def _check_json_rows(file: Path, flag: str, whole: bool) -> None:
    """A .json file is a list of objects (or JSON Lines: an object per line), an example each. From its first
    characters, a list of other values or a lone value; ``whole``: the file parsed (one row was read from it),
    a single object (its keys read as one example's columns, a columnar {"text": [...]} as one row of lists)."""
    fix = 'write its examples as a JSON list of objects ([{"text": ..., "label": ...}, ...]) or one object per line'
    with file.open("rb") as f:
        head = f.read(4096).lstrip().removeprefix(b"\xef\xbb\xbf").lstrip()
    if not whole:
        first = head[1:].lstrip()[:1] if head.startswith(b"[") else head[:1]
        if first not in (b"{", b"]", b""):
            _check_utf8(file, flag)  # a UTF-16 file's first bytes are not JSON either
            what = "a list of values, not of objects" if head.startswith(b"[") else "a single value, not objects"
            raise UsageError(f"{flag} {file} holds {what} (one per example)", fix)
        return
    if not head.startswith(b"{"):
        return
    try:
        value = json.loads(file.read_bytes())
    except ValueError:  # several objects (JSON Lines in a .json file): read as such
        return
    if isinstance(value, dict):
        keys = ", ".join(list(value)[:5])
        raise UsageError(f"{flag} {file} holds a single JSON object (keys: {keys}), not a list of examples", fix)


def _check_fields_per_line(file: Path, flag: str, names: list[str] | None) -> None:
    """Every line has the header's number of fields (``names``'s, for a file without a header)."""
    suffix = file.suffix.lower()
    expected = len(names) if names else None
    quoting = csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL
    with file.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter=FILE_SEPARATORS[suffix], quoting=quoting)
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):  # pandas skips blank lines
                continue
            if expected is None:
                expected = len(row)
            elif len(row) != expected:
                kind = "tab-separated" if suffix == ".tsv" else "comma-separated"
                raise UsageError(
                    f"{flag} {file} line {reader.line_num} has {len(row)} fields where its header has {expected}",
                    f"give every line of it {expected} {kind} fields (an empty one for a missing value)",
                )


def _builder_arguments(suffix: str, names: list[str] | None) -> tuple[str, dict]:
    """The ``datasets`` builder of a file's format and its options."""
    if suffix not in FILE_SEPARATORS:
        return ("parquet" if suffix == ".parquet" else "json"), {}
    # TSV (GLUE's included) is not quoted: a '"' in a text is a character, not the start of a quoted field.
    # Only an empty cell is missing: a text "NA", "None" or "null" stays text.
    options = dict(sep=FILE_SEPARATORS[suffix], quoting=csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL,
                   keep_default_na=False, na_values=[""])  # fmt: skip
    if names:
        options.update(column_names=names, header=None)
    return "csv", options


def _build(file: Path, names: list[str] | None, cache_dir: Path) -> Dataset | None:
    """The builder's Dataset of ``file``; None if it refuses the file or reads no rows."""
    from datasets import load_dataset

    builder, options = _builder_arguments(file.suffix.lower(), names)
    # A builder logs the file it fails on ("Failed to read file ..."): the in-memory reader names the problem.
    builders_log = logging.getLogger("datasets.packaged_modules")
    level = builders_log.level
    builders_log.setLevel(logging.CRITICAL)
    try:
        dataset = load_dataset(builder, data_files={"train": str(file.resolve())}, split="train",
                               cache_dir=str(cache_dir / "files"), **options)  # fmt: skip
    except Exception:  # noqa: BLE001 - the builders raise many types; the in-memory reader names the problem
        return None
    finally:
        builders_log.setLevel(level)
    # A JSON column of several kinds of values comes as JSON text (an Arrow extension type): refused in memory.
    mixed = any(isinstance(field.type, pa.BaseExtensionType) for field in dataset.data.schema)
    return dataset if len(dataset) and not mixed and _valid_text(dataset, builder) else None


def _valid_text(dataset: Dataset, builder: str) -> bool:
    """The JSON builder keeps text that is not UTF-8 as it is (the CSV one decodes it, and fails)."""
    try:
        if builder == "json":
            dataset.data.table.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _read_into_memory(file: Path, flag: str, names: list[str] | None) -> Dataset:
    """The file through pandas, checked: every value of a column of one kind."""
    import pandas as pd

    suffix = file.suffix.lower()
    if suffix != ".parquet":
        _check_utf8(file, flag)
    try:
        if suffix == ".parquet":
            frame = pd.read_parquet(file)
        elif suffix not in FILE_SEPARATORS:
            # dtype=False: the values as written (inference would turn a true among integer labels into 1)
            frame = pd.read_json(file, lines=suffix == ".jsonl" or _looks_like_jsonl(file), dtype=False)
        else:
            options = _builder_arguments(suffix, names)[1]
            options["names"] = options.pop("column_names", None)
            frame = pd.read_csv(file, **options)
    except pd.errors.EmptyDataError:
        raise UsageError(f"{flag} {file} is empty", "give it a header and at least one example") from None
    except (ValueError, pd.errors.ParserError, OSError) as exc:
        if suffix in FILE_SEPARATORS:  # a line with a field too many: in the words of a short one
            _check_fields_per_line(file, flag, names)
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise UsageError(f"{flag} {file} cannot be parsed ({reason})", "fix the file's format") from None
    for column in frame.columns:
        _check_one_kind(frame[column].tolist(), f"{flag} {file}", column)
    return Dataset.from_pandas(frame, preserve_index=False)


def _check_utf8(file: Path, flag: str) -> None:
    """A text file is read as UTF-8 (as the ``datasets`` builders read it): another encoding is named at its first
    byte that is not UTF-8, rather than left to a parser's message."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    end = 0  # bytes read so far
    with file.open("rb") as f:
        for chunk in itertools.chain(iter(lambda: f.read(1 << 20), b""), [b""]):  # b"": the end
            end += len(chunk)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:  # exc.object: the bytes held back from the last chunk, then this one
                raise UsageError(
                    f"{flag} {file} is not UTF-8 (byte {end - len(exc.object) + exc.start} is "
                    f"0x{exc.object[exc.start]:02x}: another encoding, such as Latin-1 or UTF-16)",
                    f"save it as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8 {file.name} > utf8-{file.name})",
                ) from None


def _kind(value: object) -> str | None:
    """What a JSON/CSV value is, for messages; None for a missing one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float | np.number):
        return "number"
    if isinstance(value, str):
        return "text"
    return {list: "list", dict: "mapping"}.get(type(value), type(value).__name__)


def _check_one_kind(values: list, where: str, column: str) -> None:
    """A column holds one kind of value: the first value of its rarest kind is named (row counted from 1)."""
    kinds = [_kind(v) for v in values]
    counts = Counter(k for k in kinds if k is not None)
    if len(counts) < 2:
        return
    rare, common = counts.most_common()[-1][0], counts.most_common(1)[0][0]
    row = kinds.index(rare)
    raise UsageError(
        f"{where} row {row + 1} column {column!r} holds {values[row]!r} (a {rare}) where its other rows hold "
        f"{common} values",
        f"give every row of column {column!r} a {common} value (quote numbers meant as text)",
    )


def _check_one_row_per_line(file: Path, rows: int, flag: str, header: bool = True) -> None:
    """Each non-blank line after the header must be one example (pandas also ends a row at a lone '\\r')."""
    with file.open("rb") as f:
        lines = sum(1 for line in f if line.strip(b"\r\n").strip(b" ")) - header  # pandas skips blank lines
    if rows != lines:
        raise UsageError(
            f"{flag} {file} has {lines} lines of examples but reads as {rows} rows",
            "remove line breaks (e.g. a stray \\r) inside its fields",
        )


def _looks_like_jsonl(file: Path) -> bool:
    with file.open() as f:
        return not f.read(1).lstrip().startswith("[")


def read_sources(args: DataArguments, seed: int, cache_dir: str | None) -> tuple[Dataset, Splits, Splits]:
    """(train, evaluation splits, test splits) as given, before any column or label is checked."""
    evals: Splits = {}
    tests: Splits = {}
    files = Path(cache_dir) if cache_dir else default_cache_dir()
    if args.train_file:
        train = read_file(args.train_file, "--train_file", files, args.task_name)
        if args.validation_file:
            evals["validation"] = read_file(args.validation_file, "--validation_file", files, args.task_name)
    elif args.dataset_name == SYNTHETIC and not args.task_name:
        rows = synthetic.generate(args.synthetic_num_examples, seed)
        names = ClassLabel(names=list(synthetic.LABEL_NAMES))
        train = Dataset.from_list(rows).remove_columns(LABEL_COLUMN)
        train = train.add_column(LABEL_COLUMN, [row[LABEL_COLUMN] for row in rows], feature=names)
    elif args.dataset_name or args.task_name:
        # --task_name alone (the default synthetic-nli untouched) means GLUE from the hub, as in run_glue.py.
        name = args.dataset_name if args.dataset_name not in (None, SYNTHETIC) else glue.HUB_DATASET
        train, evals, tests = glue.pick_splits(glue.load_source(args, cache_dir, name), name, args)
    else:
        raise UsageError("no training data given", "pass --dataset_name, --train_file or --task_name")
    if args.test_file:
        tests["test"] = read_file(args.test_file, "--test_file", files, args.task_name)
    return train, evals, tests
