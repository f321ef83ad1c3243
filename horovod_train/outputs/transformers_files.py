"""The files transformers' tools read at the end of a run: ``all_results.json``, ``train_results.json``,
``eval_results.json``, ``trainer_state.json`` (with ``log_history``), run_glue's ``predict_results*.txt`` and the
model card (``README.md``, as the Trainer's ``create_model_card`` writes it), rendered here by name for the run
directory to write (RunDirectory.write_outputs).

No ``training_args.bin``: transformers' ``TrainingArguments`` resolves its device when it is built (accelerate's
``PartialState``, which joins a job from the launcher's variables), which rank 0 alone cannot do at the end of a
run of several ranks. ``run_config.json`` holds every argument by the same names.

``all_results.json`` also carries the run's own record (engine, world size, per-rank checksums, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from horovod_train.models.model import TINY_BERT
from horovod_train.outputs.run_directory import RunFiles
from horovod_train.tasks.base import TaskShape


def results_files(results: dict[str, Any], train_metrics: dict[str, Any], state: dict) -> dict[str, dict]:
    """transformers' results files and trainer state (JSON objects) by name, in the order they are written:
    all_results.json last (it marks a finished run)."""
    epoch = {"epoch": state["epoch"]}
    evals = {k: v for k, v in results.items() if k.startswith("eval_") and not k.endswith("_per_rank")}
    return {
        RunFiles.TRAIN_RESULTS: {**train_metrics, **epoch},
        RunFiles.EVAL_RESULTS: {**evals, **epoch},
        RunFiles.TRAINER_STATE: state,
        RunFiles.FINISHED: {**results, **epoch},
    }


def prediction_files(predictions: dict[str, list], id2label: dict[int, str], shape: TaskShape) -> dict[str, str]:
    """run_glue's files, by name: a header ``index\\tprediction``, then one line per example, its prediction as the
    task's shape writes it (``shape.shown``: run_glue's and run_classification's cells)."""
    found = {}
    for split, labels in predictions.items():
        lines = ["index\tprediction", *(f"{i}\t{shape.shown(label, id2label)}" for i, label in enumerate(labels))]
        found[RunFiles.predictions(split)] = "\n".join(lines) + "\n"
    return found


def model_card_hyperparameters(config: dict[str, Any], world_size: int) -> dict[str, Any]:
    """The Trainer's hyperparameter list (transformers.modelcard.extract_hyperparameters_from_trainer), read from
    the run's arguments, with the engine that trained."""
    batch, accum = config["per_device_train_batch_size"], config["gradient_accumulation_steps"]
    found: dict[str, Any] = {
        "learning_rate": config["learning_rate"],
        "train_batch_size": batch,
        "eval_batch_size": config["per_device_eval_batch_size"],
        "seed": config["seed"],
        "engine": config["engine"],
        "num_devices": world_size,
    }
    if accum > 1:
        found["gradient_accumulation_steps"] = accum
    if batch * accum * world_size != batch:
        found["total_train_batch_size"] = batch * accum * world_size
    if world_size > 1:
        found["total_eval_batch_size"] = config["per_device_eval_batch_size"] * world_size
    found["optimizer"] = (f"Use {config['optim']} with betas=({config['adam_beta1']},{config['adam_beta2']}) "
                          f"and epsilon={config['adam_epsilon']}, weight decay {config['weight_decay']}")  # fmt: skip
    found["lr_scheduler_type"] = config["lr_scheduler_type"]
    if config["warmup_steps"]:
        found["lr_scheduler_warmup_steps"] = config["warmup_steps"]
    elif config["warmup_ratio"]:
        found["lr_scheduler_warmup_ratio"] = config["warmup_ratio"]
    if config["max_steps"] > 0:
        found["training_steps"] = config["max_steps"]
    else:
        found["num_epochs"] = config["num_train_epochs"]
    if config["bf16"] or config["fp16"]:
        found["mixed_precision_training"] = "Native AMP (bf16)" if config["bf16"] else "Native AMP"
    if config["label_smoothing_factor"]:
        found["label_smoothing_factor"] = config["label_smoothing_factor"]
    return found


def dataset_named(config: dict[str, Any]) -> str:
    """The data the run trained on, as the card names it."""
    if config.get("task_name"):
        return f"GLUE {config['task_name'].upper()}"
    if config.get("train_file"):
        return Path(config["train_file"]).name
    return config["dataset_name"]


def model_card(run_name: str, config: dict[str, Any], log_history: list[dict[str, Any]], world_size: int) -> str:
    """README.md as the Trainer's create_model_card writes it (transformers' TrainingSummary): the model, what it was
    fine-tuned from, the data, the evaluation results, the hyperparameters and the results table of each
    evaluation."""
    from transformers.modelcard import TrainingSummary, parse_log_history

    _, eval_lines, eval_results = parse_log_history(log_history)
    base = config["model_name_or_path"]
    on_hub = base != TINY_BERT and not Path(base).exists()  # the card links a hub model; a local one has no page
    summary = TrainingSummary(
        model_name=run_name,
        finetuned_from=base if on_hub else None,
        tasks="text-classification",
        dataset=dataset_named(config),
        tags=["horovod-train", config["engine"]],
        eval_results=eval_results,
        eval_lines=eval_lines,
        hyperparameters=model_card_hyperparameters(config, world_size),
        source="trainer",
    )
    return summary.to_model_card()
