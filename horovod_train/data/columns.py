"""A split's columns as run_glue.py and run_classification.py name them: its text columns (one or two, the
tokenizer's inputs, in order) and ``label``; GLUE's distributed .tsv layouts read under those names
(horovod_train/data/glue_files.py)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, DatasetDict

from horovod_train.common.errors import UsageError
from horovod_train.config.run_config import DataArguments
from horovod_train.data import glue, glue_files

AUTO_TEXT_COLUMNS = (("premise", "hypothesis"), ("sentence1", "sentence2"), ("sentence",), ("text",))
LABEL_COLUMN = "label"


def from_glue_columns(dataset: Dataset, args: DataArguments, text: list[str] | None = None) -> tuple[Dataset, str, str]:
    """GLUE's distributed .tsv layouts (glue_files: MRPC's ``#1 String``, QQP's ``is_duplicate``, STS-B's
    ``score``, MNLI's ``gold_label``, ...) under run_glue's column names, unless the columns are named by flags;
    also returns the label column and the name it has in the user's data. Given the run's ``text`` columns
    (the train data's), a split is read in a layout only where that gives it those columns: a test file of
    sentence1, sentence2 beside a train file of sentence1, sentence2, label keeps its columns."""
    named = args.text_column_names or args.label_column_name != LABEL_COLUMN
    layout = None if named else glue_files.layout_of(dataset.column_names, args.task_name)
    if layout is None or (text is not None and not set(text) <= set(layout.values())):
        return dataset, args.label_column_name, args.label_column_name
    dataset, source = glue_files.to_task_columns(dataset, layout)
    return dataset, LABEL_COLUMN, source


def resolve_text_columns(train: Dataset, args: DataArguments) -> list[str]:
    """--text_column_names, else the task's columns, else the first of AUTO_TEXT_COLUMNS the data has."""
    named = args.text_columns()
    if named:
        return named
    if args.task_name:
        return glue.task_text_columns(args.task_name)
    for candidate in AUTO_TEXT_COLUMNS:
        if set(candidate) <= set(train.column_names):
            return list(candidate)
    raise UsageError(
        "train data has no text column: none of premise+hypothesis, sentence1+sentence2, sentence or text "
        f"(has: {', '.join(train.column_names)})",
        "pass --text_column_names with one or two of its columns (comma-separated), or --task_name",
    )


def _column_fix(missing: str, label: str, args: DataArguments) -> str:
    if missing == label:
        return "pass --label_column_name with its label column"
    if args.text_column_names:
        return "pass --text_column_names with one or two of its columns (comma-separated)"
    if args.task_name:
        return f"rename its columns to --task_name {args.task_name}'s, or pass --text_column_names"
    return "give every split the train data's text columns, or pass --text_column_names"


def select_columns(dataset: Dataset, name: str, text: list[str], args: DataArguments, labelled: bool):
    """The text columns and ``label`` (the label column renamed; -1 when a test split has none), and the
    label's source column."""
    dataset, label, source = from_glue_columns(dataset, args, text)
    required = [*text, label] if labelled else text
    missing = next((column for column in required if column not in dataset.column_names), None)
    if missing is not None:
        raise UsageError(
            f"{name} data has no column {missing!r} (has: {', '.join(dataset.column_names)})",
            _column_fix(missing, label, args),
        )
    if label in text:
        raise UsageError(f"--label_column_name {label} is also a text column", "name the label column")
    if label not in dataset.column_names:
        return dataset.select_columns(text).add_column(LABEL_COLUMN, [-1] * len(dataset)), source
    dataset = dataset.select_columns([*text, label])
    dataset = dataset.rename_column(label, LABEL_COLUMN) if label != LABEL_COLUMN else dataset
    return dataset, source


def origin(name: str, args: DataArguments) -> str:
    """A split for messages: ``train data``, with the file it was read from if any."""
    files = {"train": args.train_file, "validation": args.validation_file if args.train_file else None,
             "test": args.test_file}  # fmt: skip
    return f"{name} data ({files[name]})" if files.get(name) else f"{name} data"


def check_texts(dataset: Dataset, where: str, text: list[str], labelled: bool) -> None:
    """Every text cell holds text: checked on the Arrow columns, without reading them into Python."""
    if labelled and len(dataset) == 0:
        raise UsageError(f"{where} has no examples", "provide at least one example")
    columns = dataset.with_format("arrow")
    for column in text:
        values = columns[column]
        is_text = pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
        if is_text and values.null_count == 0:
            continue
        row = pc.index(pc.is_null(values), True).as_py() if is_text else 0
        raise UsageError(
            f"{where} has empty or non-text {column} values (row {row + 1} holds {values[row].as_py()!r})",
            f"fill every {column} cell with text",
        )


def text_columns(ds: DatasetDict) -> list[str]:
    """The text columns of a load_raw_datasets result, in the order the tokenizer takes them."""
    return [column for column in ds["train"].column_names if column != LABEL_COLUMN]
