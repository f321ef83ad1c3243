"""GLUE's distributed .tsv files (glue_data/<TASK>/train.tsv, dev.tsv), generated in each task's layout.

Rows are synthetic-nli's (the label follows the texts); each task's file takes its columns and spells its
labels as GLUE does: 0/1 (MRPC's Quality, QQP's is_duplicate, CoLA, SST-2, WNLI), names (QNLI, RTE), a
float score (STS-B). ``glue_rows`` also returns what the suite reads: run_glue's columns, labels as the
indices of glue.TASK_LABEL_NAMES (STS-B: the score)."""

from __future__ import annotations

from pathlib import Path

from horovod_train.data import glue, synthetic
from support.data_files import write_glue_mnli

TASKS = ("cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb", "wnli")
STSB_PAIR_AND_SCORE = ["source1", "source2", "sentence1", "sentence2", "score"]
HEADERS = {
    "mrpc": ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
    "qqp": ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
    "cola": None,  # no header row: source, label, original mark, sentence
    "sst2": ["sentence", "label"],
    "qnli": ["index", "question", "sentence", "label"],
    "rte": ["index", "sentence1", "sentence2", "label"],
    "wnli": ["index", "sentence1", "sentence2", "label"],
    "stsb": ["index", "genre", "filename", "year", "old_index", *STSB_PAIR_AND_SCORE],
}
BOM = "\ufeff"
STSB_ORIGIN = ["main-captions", "MSRvid", "2012test"]  # genre, filename, year: as in GLUE's STS-B files


def glue_rows(task: str, n: int, seed: int) -> list[dict]:
    """What the suite should read from the task's file: run_glue's text columns and ``label``."""
    first, second = glue.TASK_TO_KEYS[task]
    rows = []
    for i, row in enumerate(synthetic.generate(n, seed)):
        premise = row["premise"] + (' "quoted' if i % 9 == 4 else "")  # GLUE's .tsv are unquoted
        texts = {first: premise} if second is None else {first: premise, second: row["hypothesis"]}
        label = float(row["label"]) + 0.25 * (i % 4) if task == "stsb" else int(row["label"] == 0)
        rows.append({**texts, "label": label})
    return rows


def _fields(task: str, i: int, row: dict) -> list[str]:
    """One line of the task's file."""
    label = row["label"]
    names = glue.TASK_LABEL_NAMES.get(task)
    pair = [row[key] for key in glue.TASK_TO_KEYS[task] if key is not None]
    by_task = {
        "mrpc": lambda: [str(label), str(1000 + i), str(2000 + i), *pair],
        "qqp": lambda: [str(i), str(2 * i), str(2 * i + 1), *pair, str(label)],
        "cola": lambda: ["gj04", str(label), "" if label else "*", *pair],
        "sst2": lambda: [*pair, str(label)],
        "qnli": lambda: [str(i), *pair, names[label]],
        "rte": lambda: [str(i), *pair, names[label]],
        "wnli": lambda: [str(i), *pair, str(label)],
        "stsb": lambda: [str(i), *STSB_ORIGIN, f"{i:04d}", "none", "none", *pair, f"{label:.3f}"],
    }
    return by_task[task]()


def write_glue_task(task: str, path: Path, n: int, seed: int, bom: bool = False) -> list[dict]:
    """The task's file at ``path`` (MNLI: support.data_files's); returns glue_rows(task, n, seed)."""
    if task == "mnli":
        rows = write_glue_mnli(path, n, seed, annotators=1)
        return [{"premise": r["premise"], "hypothesis": r["hypothesis"], "label": r["label"]} for r in rows]
    rows = glue_rows(task, n, seed)
    header = HEADERS[task]
    lines = [] if header is None else [("\ufeff" if bom else "") + "\t".join(header)]
    lines += ["\t".join(_fields(task, i, row)) for i, row in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return rows
