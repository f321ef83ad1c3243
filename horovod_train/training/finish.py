"""The end of a run: every rank's checksum and peak memory gathered into the results, the model (written by rank 0,
gathered a tensor at a time where the engine shards it), and the files rank 0 renders for the run directory to write
in one place (predictions, training curves, model card, transformers' results files: RunDirectory.write_outputs)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from horovod_train.config.run_config import TrainingArguments
from horovod_train.engines.base import Engine
from horovod_train.models import lora
from horovod_train.outputs import transformers_files
from horovod_train.outputs.run_directory import RunDirectory, RunFiles
from horovod_train.outputs.trackers import curves_png
from horovod_train.tasks.base import TaskShape
from horovod_train.tasks.registry import chance_accuracy
from horovod_train.training.parts import RunPlan
from horovod_train.training.peak_memory import peak_memory_mb
from horovod_train.training.position import TrainingPosition


def gather_results(
    engine: Engine, model: torch.nn.Module, plan: RunPlan, position: TrainingPosition, evaluation: dict[str, Any],
    train_metrics: dict[str, Any], wall_time_s: float,
) -> dict[str, Any]:  # fmt: skip
    """Collective: the run's results, with every rank's parameter checksum and peak memory."""
    checksum = torch.tensor([engine.parameter_checksum(model)], dtype=torch.int64, device=engine.device)
    peak_memory = torch.tensor([peak_memory_mb(engine.device)], dtype=torch.float64, device=engine.device)
    return {
        **train_metrics,
        **evaluation,
        **engine.describe(),
        "epoch": plan.num_epochs,
        "global_step": position.global_step,
        "history": position.history,
        "world_size_changes": position.world_sizes,
        "param_checksum_per_rank": engine.all_gather(checksum).cpu().tolist(),
        "peak_memory_mb_per_rank": engine.all_gather(peak_memory).cpu().tolist(),
        "wall_time_s": round(wall_time_s, 3),
    }


def train_metrics(
    position: TrainingPosition, plan: RunPlan, first_step: int, train_examples: int, wall_time_s: float
) -> dict[str, float]:
    """transformers' train_* summary: the mean logged loss, and throughput over this process's run (from
    ``first_step``)."""
    losses = [entry["loss"] for entry in position.log_history if "loss" in entry]
    steps = position.global_step - first_step
    return {
        "train_loss": sum(losses) / len(losses) if losses else float("nan"),
        "train_runtime": round(wall_time_s, 4),
        "train_samples": train_examples,
        "train_samples_per_second": round(steps * plan.global_batch / max(wall_time_s, 1e-9), 3),
        "train_steps_per_second": round(steps / max(wall_time_s, 1e-9), 3),
    }


def trainer_state(args: TrainingArguments, run_dir: RunDirectory, plan: RunPlan, position: TrainingPosition) -> dict:
    best = position.best_model_checkpoint
    return {
        "global_step": position.global_step,
        "max_steps": position.total_steps,
        "epoch": plan.epoch_float(position),
        "num_train_epochs": plan.num_epochs,
        "logging_steps": plan.intervals.logging,
        "eval_steps": plan.intervals.eval,
        "save_steps": plan.intervals.save,
        "train_batch_size": args.per_device_train_batch_size,
        "is_world_process_zero": True,
        "best_metric": position.best_metric,
        # transformers' form: a path (the output directory joined with the checkpoint's name, for its own)
        "best_model_checkpoint": best and str(run_dir.resolve(best)),
        "log_history": position.log_history,
    }


def write_model(engine: Engine, model: torch.nn.Module, run_dir: RunDirectory, max_shard_size: int | str) -> list[str]:
    """Collective: the model users take away, in ``save_pretrained``'s layout (safetensors files of at most
    ``max_shard_size``, with an index where there are several). Where no rank holds the whole model (fsdp), each
    tensor is gathered whole, written by rank 0 and freed in turn (engines/pretrained.py); else rank 0's
    ``save_pretrained`` writes the whole model it holds. Returns the safetensors files save_pretrained wrote, which
    it writes 0600 whatever the umask (only what it just wrote is the run's to widen: RunDirectory.write_outputs)."""
    with run_dir.recording() if engine.is_main else contextlib.nullcontext():
        if engine.write_model_shards(model, run_dir.path, max_shard_size):
            return []
    weights = engine.full_model_state(model)
    if not engine.is_main:
        return []
    output_dir, model = run_dir.path, engine.unwrap(model)
    with run_dir.recording() as saved:
        if lora.is_peft(model):  # the adapter as peft saves it, and beside it the model it makes, for pipeline()
            model.save_pretrained(output_dir / lora.ADAPTER_DIR)
            model = lora.merge_in_place(model)  # the model's last use
            weights = model.state_dict()
        model.save_pretrained(output_dir, state_dict=weights, max_shard_size=max_shard_size)
    return [name for name in sorted(saved) if name.endswith(".safetensors")]


def outputs(
    run_dir: RunDirectory, model: torch.nn.Module, predictions: dict[str, list], shape: TaskShape,
    log_history: list[dict[str, Any]], results: dict[str, Any], train_metrics: dict[str, Any], state: dict,
    config: dict[str, Any],
) -> dict[str, str | bytes | dict]:  # fmt: skip
    """Rank 0's files but the model's and the tokenizer's, rendered by name in the order they are written:
    ``predictions`` of the test splits as the task's ``shape`` writes them, the training curves, the model card,
    transformers' results files, all_results.json last (it marks a finished run)."""
    name = run_dir.run_name(config.get("run_name"))
    title = f"{name}: {results['engine']}, world size {results['world_size']}"
    curves = curves_png(log_history, title, chance_accuracy(results))
    return {
        **transformers_files.prediction_files(predictions, model.config.id2label, shape),
        **({RunFiles.TRAINING_CURVES: curves} if curves is not None else {}),
        RunFiles.MODEL_CARD: transformers_files.model_card(name, config, log_history, results["world_size"]),
        **transformers_files.results_files(results, train_metrics, state),
    }
