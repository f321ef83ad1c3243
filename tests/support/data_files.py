"""Data files and datasets the data tests build."""

from __future__ import annotations

from pathlib import Path

from horovod_train import synthetic

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
