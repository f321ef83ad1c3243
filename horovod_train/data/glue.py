"""GLUE tasks as transformers' run_glue.py knows them, and the Hugging Face sources of a DatasetDict: a hub
dataset or a directory written by ``save_to_disk`` (compute nodes have no network: prepare it on a login node), and
whether the hub answers (for models too: an unanswered probe puts the hub libraries offline)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from horovod_train.common.errors import UsageError

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

    offline_unless_reachable(name)
    try:
        return load_dataset(name, config_name, cache_dir=cache_dir)
    except Exception as exc:  # the hub raises many types (ConnectionError, FileNotFoundError, ...)
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise offline_error("dataset", name, exc) or UsageError(
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


# ---- the hub, reached or not ---------------------------------------------------------------------------------------
# A compute node without internet (the usual case on clusters) waited out huggingface_hub's retries (ten lines over
# about 100 s) before a name that is not cached failed: one short probe of the hub endpoint decides instead, and
# where it gets no answer the hub libraries go offline (HF_HUB_OFFLINE's mode), in which a name already in the HF
# cache still loads and one that is not fails at once. Models' too (model.py's loaders).

# An answer from the hub (any HTTP status) within this counts as reachable. A login node's round trip is well
# under a second; a firewall that drops packets would otherwise hold the connection until TCP gives up.
HUB_PROBE_TIMEOUT_S = 5.0
# The fix for a name the HF cache lacks while the hub is offline: where to take it from instead.
LOCAL_COPY = {
    "dataset": "pass a directory DatasetDict.save_to_disk wrote (or --train_file)",
    "model": "pass a local model directory (save_pretrained's, or `hf download NAME --local-dir DIR`)",
}
CACHE_IT = (
    "; or fill the HF cache (HF_HOME) with it on a node with network, and HF_HUB_OFFLINE=1 loads it from there "
    "without probing the hub"
)

_probed: dict[str, bool] = {}


def is_local_path(name: str) -> bool:
    """A directory (or a path meant as one) rather than a hub repository id."""
    return Path(name).exists() or Path(name).is_absolute() or name.startswith(("./", "../", "~"))


def hub_offline() -> bool:
    """Whether the hub libraries are in offline mode: set by the user (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE), or by
    ``offline_unless_reachable``."""
    from huggingface_hub import constants

    return constants.is_offline_mode()


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def offline_unless_reachable(name: str) -> None:
    """Before ``name`` is looked up on the hub: where the hub does not answer, offline mode from here on (one probe
    a process). A local directory, or a process already offline, probes nothing."""
    if is_local_path(name) or hub_offline():
        return
    url = hub_endpoint()
    if url not in _probed:
        _probed[url] = hub_reachable(url)
    if not _probed[url]:
        go_offline()


def hub_reachable(url: str, timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """One HEAD request through huggingface_hub's own HTTP client (its proxies and certificates), without retries;
    in a thread, so that a name lookup that hangs (no DNS answer) is bounded by ``timeout`` too."""
    from huggingface_hub.utils import get_session

    answered: list[bool] = []

    def probe() -> None:
        try:
            get_session().head(url, timeout=timeout)
        except Exception:  # noqa: BLE001 - httpx's errors, OSError, the libraries' own: all mean no answer
            return
        answered.append(True)

    thread = threading.Thread(target=probe, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answered)


def go_offline() -> None:
    """HF_HUB_OFFLINE=1 for this process and those it starts: huggingface_hub and datasets read it once, at import,
    so their copies are set too where they are imported already (transformers asks huggingface_hub)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = True
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        datasets_config.HF_HUB_OFFLINE = datasets_config.HF_DATASETS_OFFLINE = True


def offline_error(what: str, name: str, exc: BaseException) -> UsageError | None:
    """The one line for a hub name that did not load because the hub is offline and the HF cache lacks it; None
    for any other failure (the loader's own message says what is wrong)."""
    if is_local_path(name) or not hub_offline() or not _for_want_of_the_hub(exc):
        return None
    why = "HF_HUB_OFFLINE is set" if _probed.get(hub_endpoint()) is not False else f"{hub_endpoint()} did not answer"
    local = LOCAL_COPY["dataset" if what == "dataset" else "model"].replace("NAME", name)
    return UsageError(f"cannot load {what} {name!r}: it is not in the HF cache and the hub is offline ({why})",
                      local + CACHE_IT)  # fmt: skip


def _for_want_of_the_hub(exc: BaseException | None) -> bool:
    """Whether ``exc`` or an error it was raised from is the hub libraries' "offline and not cached" (transformers
    wraps it in an OSError; datasets raises a ConnectionError)."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, LocalEntryNotFoundError | ConnectionError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
