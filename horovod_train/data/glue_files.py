"""GLUE's distributed .tsv files (glue_data/<TASK>/train.tsv, dev.tsv, test.tsv) as they are: each task's
columns mapped to run_glue's text columns (glue.TASK_TO_KEYS) and ``label``. The 0/1 labels of MRPC, QQP,
CoLA, SST-2 and WNLI are the indices of glue.TASK_LABEL_NAMES (1: equivalent, duplicate, acceptable,
positive, entailment); QNLI, RTE and MNLI spell their labels as those names; STS-B's label is a float score."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Dataset

BOM = "\ufeff"
# CoLA's train.tsv and dev.tsv have no header row: source code, label, the original author's mark, sentence.
COLA_COLUMNS = ("source", "label", "original_label", "sentence")
# Each task's file columns -> run_glue's; the last entry is the label (absent from test.tsv).
# Headers of the other tasks' files (mapped to themselves): SST-2 "sentence label", QNLI "index question
# sentence label", RTE and WNLI "index sentence1 sentence2 label"; CoLA's test.tsv "index sentence".
LAYOUTS: dict[str, dict[str, str]] = {
    "mrpc": {"#1 String": "sentence1", "#2 String": "sentence2", "Quality": "label"},  # + "#1 ID", "#2 ID"
    "qqp": {"question1": "question1", "question2": "question2", "is_duplicate": "label"},  # + id qid1 qid2
    # + index genre filename year old_index source1 source2
    "stsb": {"sentence1": "sentence1", "sentence2": "sentence2", "score": "label"},
    # + index promptID pairID genre *_parse label1..label5 (MNLI and SNLI)
    "mnli": {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"},
}
LABEL_COLUMN = "label"


def headerless_columns(task_name: str | None, path: Path) -> list[str] | None:
    """The column names of a CoLA train/dev .tsv (no header row); None for a file with a header."""
    if task_name != "cola" or path.suffix.lower() != ".tsv":
        return None
    with path.open(encoding="utf-8", errors="replace") as f:
        first = f.readline().rstrip("\r\n").removeprefix(BOM).split("\t")
    has_header = "sentence" in first or len(first) != len(COLA_COLUMNS)
    return None if has_header else list(COLA_COLUMNS)


def without_bom(dataset: Dataset) -> Dataset:
    """A first column named with the UTF-8 byte order mark some copies of GLUE's files start with, renamed."""
    first = dataset.column_names[0] if dataset.column_names else ""
    return dataset.rename_column(first, first.removeprefix(BOM)) if first.startswith(BOM) else dataset


def layout_of(columns: list[str], task_name: str | None) -> dict[str, str] | None:
    """The GLUE file layout ``columns`` are in: the task's (MNLI's also without --task_name), if its text
    columns are all there and run_glue's are not."""
    task = task_name or "mnli"
    layout = LAYOUTS.get(task)
    if layout is None:
        return None
    texts = [source for source, target in layout.items() if target != LABEL_COLUMN]
    targets = [target for source, target in layout.items() if source != target]
    if set(texts) <= set(columns) and set(targets).isdisjoint(columns):
        return layout
    return None


def to_task_columns(dataset: Dataset, layout: dict[str, str]) -> tuple[Dataset, str]:
    """The layout's columns under run_glue's names, and the file's name of its label column."""
    present = [source for source in layout if source in dataset.column_names]
    renames = {source: layout[source] for source in present if layout[source] != source}
    label = next(source for source, target in layout.items() if target == LABEL_COLUMN)
    return dataset.select_columns(present).rename_columns(renames), label
