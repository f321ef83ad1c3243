"""GLUE tasks as transformers' run_glue.py knows them, and the Hugging Face sources of a DatasetDict: a hub
dataset or a directory written by ``save_to_disk`` (compute nodes have no network: prepare it on a login node)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from horovod_train.errors import UsageError

if TYPE_CHECKING:  # datasets is imported when data is loaded, not when the config is checked
    from datasets import Dataset, DatasetDict


class DataArguments(Protocol):
    """The fields of config.DataArguments read here (config imports this module to check --task_name)."""

    task_name: str | None
    dataset_config_name: str | None
    validation_split_name: str | None


HUB_DATASET = "nyu-mll/glue"
HUB_ALIASES = (HUB_DATASET, "glue")  # whose configurations are the task names
TASK_TO_KEYS: dict[str, tuple[str, str | None]] = {
    "cola": ("sentence", None),
    "mnli": ("premise", "hypothesis"),
    "mrpc": ("sentence1", "sentence2"),
    "qnli": ("question", "sentence"),
    "qqp": ("question1", "question2"),
    "rte": ("sentence1", "sentence2"),
    "sst2": ("sentence", None),
    "stsb": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}
# nyu-mll/glue's ClassLabel names; GLUE's own .tsv files spell string labels the same way (RTE, QNLI).
TASK_LABEL_NAMES: dict[str, tuple[str, ...]] = {
    "cola": ("unacceptable", "acceptable"),
    "mnli": ("entailment", "neutral", "contradiction"),
    "mrpc": ("not_equivalent", "equivalent"),
    "qnli": ("entailment", "not_entailment"),
    "qqp": ("not_duplicate", "duplicate"),
    "rte": ("entailment", "not_entailment"),
    "sst2": ("negative", "positive"),
    "wnli": ("not_entailment", "entailment"),
}
TASK_EVAL_SPLITS = {"mnli": ("validation_matched", "validation_mismatched")}  # run_glue evaluates on both
REGRESSION_TASKS = ("stsb",)  # one float label: a regression (tasks/regression.py), as run_glue.py sets num_labels=1
# run_glue.py's compute_metrics keys ("glue" in evaluate): combined_score is the mean where a task has two scores.
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_correlation",),
    "mrpc": ("accuracy", "f1", "combined_score"),
    "qqp": ("accuracy", "f1", "combined_score"),
    "stsb": ("pearson", "spearmanr", "combined_score"),
}
DEFAULT_TASK_METRICS = ("accuracy",)  # mnli (on each validation split), qnli, rte, sst2, wnli


def check_task(task_name: str | None) -> None:
    if task_name is None:
        return
    if task_name not in TASK_TO_KEYS:
        raise UsageError(f"unknown --task_name {task_name!r}", f"use one of {', '.join(TASK_TO_KEYS)}")


def task_metric_names(task_name: str) -> tuple[str, ...]:
    return TASK_METRICS.get(task_name, DEFAULT_TASK_METRICS)


def task_text_columns(task_name: str) -> list[str]:
    return [key for key in TASK_TO_KEYS[task_name] if key is not None]


def is_saved_dataset(name: str) -> bool:
    return Path(name).is_dir()


def load_saved(path: str) -> DatasetDict:
    """A ``DatasetDict.save_to_disk`` directory, or a ``Dataset.save_to_disk`` one taken as the train split."""
    from datasets import DatasetDict, load_from_disk

    directory = Path(path)
    is_dict = (directory / "dataset_dict.json").is_file()
    if not is_dict and not ((directory / "state.json").is_file() and (directory / "dataset_info.json").is_file()):
        raise UsageError(
            f"--dataset_name {path} is a directory but not one written by save_to_disk "
            "(no dataset_dict.json, state.json or dataset_info.json)",
            "write it with DatasetDict.save_to_disk (on a node with network access), or pass --train_file",
        )
    try:
        loaded = load_from_disk(str(directory))
    except Exception as exc:  # a damaged directory raises many types (FileNotFoundError, ArrowInvalid, ...)
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        problem = f"cannot load dataset directory {path} ({reason})"
        raise UsageError(problem, "write it again with save_to_disk") from None
    return loaded if isinstance(loaded, DatasetDict) else DatasetDict(train=loaded)


def load_hub(name: str, config_name: str | None, cache_dir: str | None) -> DatasetDict:
    from datasets import load_dataset

    try:
        return load_dataset(name, config_name, cache_dir=cache_dir)
    except Exception as exc:  # the hub raises many types (ConnectionError, FileNotFoundError, ...)
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise UsageError(
            f"cannot load dataset {name!r} ({reason})",
            "use --train_file, a save_to_disk directory, --dataset_name synthetic-nli, or a hub name with network "
            "access",
        ) from None


def load_source(args: DataArguments, cache_dir: str | None, name: str) -> DatasetDict:
    if is_saved_dataset(name):
        return load_saved(name)
    if Path(name).is_absolute() or name.startswith(("./", "../", "~")):
        raise UsageError(f"--dataset_name {name} does not exist", "pass a directory written by save_to_disk")
    config_name = args.dataset_config_name or (args.task_name if name in HUB_ALIASES else None)
    return load_hub(name, config_name, cache_dir)


def pick_splits(
    source: DatasetDict, name: str, args: DataArguments
) -> tuple[Dataset, dict[str, Dataset], dict[str, Dataset]]:
    """(train, evaluation splits, test splits) as load_raw_datasets names them: one evaluation split is
    ``validation``; several keep their names (``validation_matched`` first for MNLI). A hub dataset without
    --task_name or --validation_split_name has none (the train set's 10% is held out, as the tutorials do)."""
    if "train" not in source:
        raise UsageError(f"dataset {name!r} has no split 'train' (has: {', '.join(source)})", "give it a train split")
    if args.validation_split_name:
        if args.validation_split_name not in source:
            raise UsageError(
                f"dataset {name!r} has no split {args.validation_split_name!r}", f"use one of {', '.join(source)}"
            )
        evals = [args.validation_split_name]
    else:
        wanted = TASK_EVAL_SPLITS.get(args.task_name, ("validation",)) if args.task_name else ()
        evals = [split for split in wanted if split in source]
        if not evals and (args.task_name or is_saved_dataset(name)):
            evals = [split for split in source if split.startswith("validation")]
    named = {"validation": evals[0]} if len(evals) == 1 else {split: split for split in evals}
    tests = {split: source[split] for split in source if split.startswith("test")}
    return source["train"], {key: source[split] for key, split in named.items()}, tests
