"""Evaluation and prediction: every example of a split once over all ranks (each rank runs the model over
its strided shard, which follows the current world size), the outputs gathered exactly."""

from __future__ import annotations

import time
from typing import Any

import torch
from datasets import DatasetDict
from torch import nn
from torch.utils.data import DataLoader

from horovod_train import data as data_lib
from horovod_train.amp import Precision
from horovod_train.config import TrainingArguments
from horovod_train.engines.base import Engine
from horovod_train.metrics import exact_metrics


def eval_prefixes(tokenized: DatasetDict) -> dict[str, str]:
    """Each validation split's metric prefix: ``eval`` for the first (primary), ``eval_<split>`` after."""
    names = data_lib.eval_split_names(tokenized)
    return {name: "eval" if i == 0 else f"eval_{name}" for i, name in enumerate(names)}


@torch.no_grad()
def gather_outputs(
    engine: Engine, net: nn.Module, loader: DataLoader, precision: Precision, labelled: bool,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``net`` over this rank's shard and gather every rank's rows in rank order: (example index,
    prediction, label) and each example's loss; unlabelled (prediction): (example index, prediction)."""
    rows = [torch.zeros((0, 3 if labelled else 2), dtype=torch.int64)]
    losses = [torch.zeros(0, dtype=torch.float64)]
    net.eval()
    for batch in loader:
        index = batch.pop("example_index")
        labels = batch.pop("labels", None)
        batch = {k: v.to(engine.device, non_blocking=True) for k, v in batch.items()}
        with precision.autocast():
            logits = net(**batch).logits
        columns = [index, logits.argmax(dim=-1).cpu()]
        if labelled:
            labels = labels.to(engine.device, non_blocking=True)
            loss = nn.functional.cross_entropy(
                logits.float(), labels, reduction="none", label_smoothing=label_smoothing
            )
            columns.append(labels.cpu())
            losses.append(loss.double().cpu())
        rows.append(torch.stack(columns, dim=1))
    net.train()
    gathered = engine.all_gather(torch.cat(rows).to(engine.device)).cpu()
    if not labelled:
        return gathered, None
    return gathered, engine.all_gather(torch.cat(losses).to(engine.device)).cpu()


class Evaluator:
    def __init__(
        self, engine: Engine, model: nn.Module, tokenizer: Any, tokenized: DatasetDict, args: TrainingArguments,
        precision: Precision,
    ) -> None:  # fmt: skip
        self.engine, self.model, self.precision = engine, model, precision
        self.tokenizer, self.tokenized = tokenizer, tokenized
        self.batch_size, self.label_smoothing = args.per_device_eval_batch_size, args.label_smoothing_factor

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
        engine = self.engine
        rows, losses = self.outputs(split, labelled=True)
        result = exact_metrics(rows, losses, len(self.tokenized[split]))
        per_rank = engine.all_gather(torch.tensor([result["accuracy"]], dtype=torch.float64, device=engine.device))
        result["accuracy_per_rank"] = per_rank.cpu().tolist()
        return result

    def predict(self) -> dict[str, list[int]]:
        """Predictions of every test split, in example order (all ranks take part; rank 0 keeps them)."""
        found = {}
        for name in data_lib.test_split_names(self.tokenized):
            rows, _ = self.outputs(name, labelled=False)
            found[name] = rows[torch.argsort(rows[:, 0]), 1].tolist()
        return found

    def outputs(self, split: str, labelled: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        engine = self.engine
        loader = data_lib.eval_loader(
            self.tokenized[split], self.tokenizer, self.batch_size, engine.world_size, engine.rank
        )
        net = engine.unwrap(self.model)
        return gather_outputs(engine, net, loader, self.precision, labelled, self.label_smoothing)
