"""Evaluation and prediction: every example of a split once over all ranks (each rank runs the model over
its strided shard, which follows the current world size), the outputs gathered exactly."""

from __future__ import annotations

import time
from typing import Any

import torch
from datasets import DatasetDict
from torch import nn
from torch.utils.data import DataLoader

from horovod_train.config.run_config import TrainingArguments
from horovod_train.data.labels import label_names, shape_of
from horovod_train.data.loaders import BatchWidths, eval_loader
from horovod_train.data.splits import eval_split_names, test_split_names
from horovod_train.engines.base import Engine
from horovod_train.tasks.base import TaskShape
from horovod_train.tasks.single_label import SingleLabel
from horovod_train.training.amp import Precision
from horovod_train.training.metrics import exact_metrics

CLASSIFICATION = SingleLabel()  # two classes: what gather_outputs scores unless told


def eval_prefixes(tokenized: DatasetDict) -> dict[str, str]:
    """Each validation split's metric prefix: ``eval`` for the first (primary), ``eval_<split>`` after."""
    names = eval_split_names(tokenized)
    return {name: "eval" if i == 0 else f"eval_{name}" for i, name in enumerate(names)}


@torch.no_grad()
def gather_outputs(
    engine: Engine,
    net: nn.Module,
    loader: DataLoader,
    precision: Precision,
    labelled: bool,
    label_smoothing: float = 0.0,
    shape: TaskShape = CLASSIFICATION,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``net`` over this rank's shard and gather every rank's rows in rank order: (example index,
    prediction(s), label(s)) and each example's loss; unlabelled (prediction): (example index, prediction(s)).
    The rows are of ``shape.row_dtype`` (float64 for a regression: exact for a float32 output and any index
    below 2**53)."""
    dtype = shape.row_dtype
    rows = [torch.zeros((0, 1 + shape.outputs * (2 if labelled else 1)), dtype=dtype)]
    losses = [torch.zeros(0, dtype=torch.float64)]
    fillers = forwards_to_fill(engine, len(loader))  # asked before any forward pass
    net.eval()
    for batch in loader:
        index = batch.pop("example_index")
        labels = batch.pop("labels", None)
        batch = {k: v.to(engine.device, non_blocking=True) for k, v in batch.items()}
        with precision.autocast():
            logits = net(**batch).logits
        columns = [index.reshape(-1, 1), shape.predictions(logits).cpu()]
        if labelled:
            labels = labels.to(engine.device, non_blocking=True)
            losses.append(shape.losses(logits, labels, label_smoothing).double().cpu())
            columns.append(labels.reshape(len(index), -1).cpu())
        rows.append(torch.cat([column.to(dtype) for column in columns], dim=1))
    fill_forwards(engine, net, fillers, precision)
    net.train()
    gathered = engine.all_gather(torch.cat(rows).to(engine.device)).cpu()
    if not labelled:
        return gathered, None
    return gathered, engine.all_gather(torch.cat(losses).to(engine.device)).cpu()


def forwards_to_fill(engine: Engine, batches: int) -> int:
    """Where the model's forward is a collective (fsdp), the forward passes this rank adds after its own ``batches``
    to run as many as the rank with the most (to be asked before any forward pass); elsewhere 0."""
    if not engine.forward_is_collective:
        return 0
    counts = engine.all_gather(torch.tensor([batches], dtype=torch.int64, device=engine.device))
    return int(counts.max()) - batches


def fill_forwards(engine: Engine, net: nn.Module, count: int, precision: Precision) -> None:
    """``count`` forward passes on a one-token filler, whose outputs are not used."""
    filler = {"input_ids": torch.zeros((1, 1), dtype=torch.int64, device=engine.device)}
    for _ in range(count):
        with precision.autocast():
            net(**filler)


class Evaluator:
    def __init__(
        self, engine: Engine, model: nn.Module, tokenizer: Any, tokenized: DatasetDict, args: TrainingArguments,
        precision: Precision, task_name: str | None = None, widths: BatchWidths | None = None,
    ) -> None:  # fmt: skip
        self.engine, self.model, self.precision, self.widths = engine, model, precision, widths
        self.tokenizer, self.tokenized = tokenizer, tokenized
        self.batch_size, self.label_smoothing = args.per_device_eval_batch_size, args.label_smoothing_factor
        self.shape = task_shape(tokenized, task_name, args.multi_label_threshold)

    def evaluate_all(self) -> dict[str, Any]:
        """Every validation split, keyed as transformers does: ``eval_<metric>`` for the first (primary)
        split, ``eval_<split>_<metric>`` for each other one (MNLI's validation_mismatched)."""
        started = time.perf_counter()
        result: dict[str, Any] = {}
        for name, prefix in eval_prefixes(self.tokenized).items():
            result.update({f"{prefix}_{k}": v for k, v in self.evaluate(name).items()})
        result["eval_runtime"] = round(time.perf_counter() - started, 4)
        result["eval_samples_per_second"] = round(result["eval_samples"] / max(result["eval_runtime"], 1e-9), 3)
        return result

    def evaluate(self, split: str) -> dict[str, Any]:
        """The split's metrics; ``<first metric>_per_rank``: every rank's value of it (all equal: exact)."""
        engine = self.engine
        rows, losses = self.outputs(split, labelled=True)
        result = exact_metrics(rows, losses, len(self.tokenized[split]), self.shape)
        first = self.shape.metric_names()[0]
        per_rank = engine.all_gather(torch.tensor([result[first]], dtype=torch.float64, device=engine.device))
        result[f"{first}_per_rank"] = per_rank.cpu().tolist()
        return result

    def describe(self) -> dict[str, Any]:
        """The results' record of what was scored (the result line reads it): the task's shape, the primary split."""
        split = eval_split_names(self.tokenized)[0]
        return {"problem_type": self.shape.name, "num_labels": self.shape.num_labels, "validation_split": split}

    def predict(self) -> dict[str, list]:
        """Predictions of every test split, in example order (all ranks take part; rank 0 keeps them): a
        class id, a float (regression) or the list of predicted class ids (multi-label) per example."""
        found = {}
        for name in test_split_names(self.tokenized):
            rows, _ = self.outputs(name, labelled=False)
            found[name] = self.shape.predicted(rows[torch.argsort(rows[:, 0].long()), 1:])
        return found

    def outputs(self, split: str, labelled: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        engine = self.engine
        loader = eval_loader(
            self.tokenized[split], self.tokenizer, self.batch_size, engine.world_size, engine.rank, self.widths
        )
        net = engine.eval_module(self.model)
        return gather_outputs(engine, net, loader, self.precision, labelled, self.label_smoothing, self.shape)


def task_shape(tokenized: DatasetDict, task_name: str | None, threshold: float = 0.5) -> TaskShape:
    """The run's TaskShape, from its tokenized labels (their feature says the shape)."""
    return shape_of(tokenized)(len(label_names(tokenized)), task_name, threshold)
