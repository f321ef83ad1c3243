"""Data files and datasets the data tests build."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from horovod_train.data import synthetic

GLUE_MNLI_COLUMNS = [
    "index",
    "promptID",
    "pairID",
    "genre",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
]


def _parses(text: str) -> list[str]:
    words = text.split()
    return ["( " + " ".join(words) + " )", "(ROOT (S " + " ".join(f"(NN {w})" for w in words) + "))"]


def write_glue_mnli(path: Path, n: int, seed: int, annotators: int) -> list[dict]:
    """GLUE's MNLI .tsv layout (train.tsv: 1 annotator label, dev_matched.tsv: 5): unquoted, string labels,
    and, as in MNLI, texts with unbalanced double quotes."""
    rows = synthetic.generate(n, seed)
    header = [*GLUE_MNLI_COLUMNS, *(f"label{i}" for i in range(1, annotators + 1)), "gold_label"]
    lines = ["\t".join(header)]
    for i, row in enumerate(rows):
        if i % 7 == 3:
            row["premise"] = '"' + row["premise"]
        if i % 11 == 5:
            row["hypothesis"] += ' "really'
        gold = synthetic.LABEL_NAMES[row["label"]]
        premise_parses, hypothesis_parses = _parses(row["premise"]), _parses(row["hypothesis"])
        fields = [str(i), str(9000 + i), f"{9000 + i}e", "fiction", premise_parses[0], hypothesis_parses[0]]
        fields += [premise_parses[1], hypothesis_parses[1], row["premise"], row["hypothesis"]]
        lines.append("\t".join([*fields, *[gold] * annotators, gold]))
    path.write_text("\n".join(lines) + "\n")
    return rows


# ---- bad data files, by combination (tests/unit/test_data_sources.py's property test, and a sample of them as
# real programs in tests/integration/test_bad_input.py) -----------------------------------------------------------
COLUMNS = ("premise", "hypothesis", "label")
FORMATS = (".csv", ".tsv", ".json", ".jsonl")
SPLITS = {"train": "--train_file", "validation": "--validation_file", "test": "--test_file"}


def encode_rows(rows: list, suffix: str, encoding: str = "utf-8", header: list[str] | None = None) -> bytes:
    """``rows`` (dicts, or for CSV and TSV lists of fields under ``header``) in the file format of ``suffix``."""
    if suffix == ".json":
        return json.dumps(rows, ensure_ascii=False).encode(encoding)
    if suffix == ".jsonl":
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode(encoding)
    lines = [header or list(rows[0])] + [[str(v) for v in (row.values() if isinstance(row, dict) else row)]
                                         for row in rows]  # fmt: skip
    separator = "," if suffix == ".csv" else "\t"
    return "".join(separator.join(line) + "\n" for line in lines).encode(encoding)


def nli_rows(n: int, seed: int) -> list[dict]:
    """Of COLUMNS, every label among any three rows (a split of them has two or more labels)."""
    return [{"premise": row["premise"], "hypothesis": row["hypothesis"], "label": i % 3}
            for i, row in enumerate(synthetic.generate(n, seed))]  # fmt: skip


@dataclass(frozen=True)
class BadData:
    """Files (name: content) and `train` flags ({dir}: where the files are) that must be refused in one line
    containing ``cause``."""

    files: dict[str, bytes]
    flags: tuple[str, ...]
    cause: str

    def write(self, directory: Path) -> list[str]:
        for name, content in self.files.items():
            (directory / name).write_bytes(content)
        return [flag.replace("{dir}", str(directory)) for flag in self.flags]


# What each defect applies to: the formats, and the splits whose file carries it.
DEFECTS = {
    "text column twice": (FORMATS, ("train",)),
    "label column as text": (FORMATS, ("train",)),
    "column missing from a split": (FORMATS, ("validation", "test")),
    "label column missing": (FORMATS, ("train", "validation")),
    "one json object": ((".json",), tuple(SPLITS)),
    "json list of values": ((".json",), tuple(SPLITS)),
    "short line": ((".csv", ".tsv"), tuple(SPLITS)),
    "long line": ((".csv", ".tsv"), tuple(SPLITS)),
    "latin-1": (FORMATS, tuple(SPLITS)),
    "utf-16": (FORMATS, tuple(SPLITS)),
    "single example": (FORMATS, ("train",)),
}


def bad_data(defect: str, suffix: str, split: str, n: int, seed: int, line: int) -> BadData:
    """``defect`` in a ``suffix`` file of ``split`` (the others good), of ``n`` examples (at least 4) drawn with
    ``seed``; ``line``: which of its example lines (0 .. n - 1) a line defect is in."""
    rows = {name: nli_rows(n, seed + i) for i, name in enumerate(SPLITS)}
    rows["test"] = [{k: v for k, v in row.items() if k != "label"} for row in rows["test"]]
    flags: list[str] = []
    content: bytes | None = None
    shown = f"{{dir}}/{split}{suffix}"
    if defect == "text column twice":
        column = COLUMNS[seed % 2]
        flags, cause = ["--text_column_names", f"{column},{column}"], f"names column {column!r} twice"
    elif defect == "label column as text":
        flags, cause = ["--label_column_name", "premise"], "--label_column_name premise is also a text column"
    elif defect == "column missing from a split":
        rows[split] = [{k: v for k, v in row.items() if k != "hypothesis"} for row in rows[split]]
        cause = f"{split} data has no column 'hypothesis'"
    elif defect == "label column missing":
        flags, cause = ["--label_column_name", "gold"], f"{split} data has no column 'gold'"
        rows = {name: [{("gold" if k == "label" else k): v for k, v in row.items()} for row in split_rows]
                for name, split_rows in rows.items()}  # fmt: skip
        rows[split] = [{k: v for k, v in row.items() if k != "gold"} for row in rows[split]]
    elif defect == "one json object":
        content = json.dumps(rows[split][line]).encode()
        cause = f"{shown} holds a single JSON object"
    elif defect == "json list of values":
        content = json.dumps([row["premise"] for row in rows[split]]).encode()
        cause = f"{shown} holds a list of values"
    elif defect in ("short line", "long line"):
        fields = [list(row.values()) for row in rows[split]]
        width = len(fields[line])
        fields[line] = fields[line][:-1] if defect == "short line" else [*fields[line], "extra"]
        content = encode_rows(fields, suffix, header=list(rows[split][0]))
        cause = f"{shown} line {line + 2} has {len(fields[line])} fields where its header has {width}"
    elif defect in ("latin-1", "utf-16"):
        rows[split][line]["premise"] += " at the caf\xe9"
        content = encode_rows(rows[split], suffix, "latin-1" if defect == "latin-1" else "utf-16")
        cause = f"{shown} is not UTF-8"
    elif defect == "single example":
        rows[split] = rows[split][:1]
        cause = "train data has a single example"
    else:
        raise ValueError(defect)
    files = {f"{name}{suffix}": encode_rows(split_rows, suffix) for name, split_rows in rows.items()}
    if content is not None:
        files[f"{split}{suffix}"] = content
    files = {name: content for name, content in files.items() if name.startswith(("train", split))}
    for name, flag in SPLITS.items():
        flags += [flag, f"{{dir}}/{name}{suffix}"] if f"{name}{suffix}" in files else []
    return BadData(files, tuple(flags), cause)
