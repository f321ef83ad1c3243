"""Started under a real launcher by tests/integration/test_engine_contract.py: drives one engine through the interface
the trainer uses and writes what this rank saw to OUT/rank-<rank>.json.

Usage: python tests/probes/engine_probe.py ENGINE OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import BertConfig, BertForSequenceClassification

from horovod_train.config.run_config import RunConfig, TrainingArguments
from horovod_train.engines import create_engine
from horovod_train.engines.policy import RunPolicy
from horovod_train.outputs.checksums import tensors_checksum
from horovod_train.outputs.run_directory import RunDirectory
from horovod_train.training.amp import Precision
from horovod_train.training.evaluation import fill_forwards, forwards_to_fill


def tiny_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)  # a different init on every rank: wrap() must make them equal
    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config)


def checksums(engine, model) -> list[int]:
    local = torch.tensor([engine.parameter_checksum(model)], dtype=torch.int64, device=engine.device)
    return engine.all_gather(local).cpu().tolist()


def state_digest(state: dict) -> int:
    """The digest of a whole optimizer state's tensors, in index order."""
    return tensors_checksum((f"{i}.{k}", v) for i, entry in sorted(state["state"].items())
                            for k, v in sorted(entry.items()))  # fmt: skip


def model_state(engine, model, optimizer) -> dict:
    """What the engine gathers (rank 0) of the model and its optimizer, and what loading it back leaves."""
    whole = engine.full_model_state(model)
    optimizer_state = engine.full_optimizer_state(model, optimizer)
    found = {"parameter_checksum": engine.parameter_checksum(model)}
    if engine.is_main:
        found["whole_model_checksum"] = tensors_checksum(sorted(whole.items()))
        found["optimizer_indices"] = sorted(optimizer_state["state"])
        found["optimizer_shapes"] = [list(optimizer_state["state"][i]["exp_avg"].shape)
                                     for i in sorted(optimizer_state["state"])]  # fmt: skip
        found["optimizer_digest"] = state_digest(optimizer_state)
    # Loaded back on every rank (as a resume does, from rank 0's copy), then gathered again: the same state.
    # Copies: a replicated engine's are the model's own tensors, which the zeros below overwrite.
    whole = {k: v.clone() for k, v in whole.items()}
    whole, optimizer_state = engine.broadcast_object((whole, optimizer_state))
    engine.load_model_state(model, {k: torch.zeros_like(v) for k, v in whole.items()})
    found["zeroed_checksum"] = engine.parameter_checksum(model)
    engine.load_model_state(model, whole)
    engine.load_optimizer_state(model, optimizer, optimizer_state)
    again = engine.full_optimizer_state(model, optimizer)
    found["reloaded_checksum"] = engine.parameter_checksum(model)
    if engine.is_main:
        found["reloaded_optimizer_digest"] = state_digest(again)
    return found


def evaluate_unevenly(engine, model) -> bool:
    """Rank r has r + 1 batches, as evaluation's uneven shards: the ranks with fewer add forward passes."""
    net = engine.eval_module(model)
    fillers = forwards_to_fill(engine, engine.rank + 1)
    with torch.no_grad():
        for _ in range(engine.rank + 1):
            net(input_ids=torch.randint(0, 50, (2, 6), device=engine.device))
        fill_forwards(engine, net, fillers, Precision("fp32", engine.device))
    engine.barrier()
    return True


def accumulate(engine, model, batch: dict) -> list[int]:
    """Two micro-steps of half the batch each; the reduce-scatters (the real collective, counted) after each: a
    sharded engine reduce-scatters the gradient once per optimizer step, after the last."""
    counts, real = [], dist.reduce_scatter_single
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    dist.reduce_scatter_single = counted
    try:
        for half, last in ((slice(0, 2), False), (slice(2, 4), True)):
            with engine.accumulation_context(model, is_last_micro_step=last):
                engine.forward_loss(model, {k: v[half] for k, v in batch.items()}).backward()
            counts.append(len(calls))
    finally:
        dist.reduce_scatter_single = real
    return counts


def probe(engine, out: Path) -> dict:
    rank = engine.rank
    report = {
        "rank": rank,
        "local_rank": engine.local_rank,
        "world_size": engine.world_size,
        "is_main": engine.is_main,
        "device": str(engine.device),
        "describe": engine.describe(),
    }
    big = float(2**40)  # sums of these lose their last digits in float32
    values = torch.tensor([big + rank + 1, 0.1 * (rank + 1)], dtype=torch.float64)
    report["sum"] = engine.all_reduce_sum(values).tolist()
    rows = torch.full((rank + 1, 2), rank, dtype=torch.int64, device=engine.device)  # uneven: rank r has r + 1 rows
    report["gathered"] = engine.all_gather(rows).cpu().tolist()
    report["objects"] = engine.gather_objects({"rank": rank})
    report["broadcast"] = engine.broadcast_object({"from": rank, "payload": list(range(5))} if engine.is_main else None)
    order = out / "local_main_first.txt"
    engine.local_main_first(lambda: order.open("a").write(f"{engine.local_rank}\n"))
    engine.barrier()

    model = tiny_model(seed=rank)
    shapes = [list(p.shape) for p in model.parameters()]
    model, optimizer = engine.prepare(model, lambda module: torch.optim.AdamW(module.parameters(), lr=1e-2))
    report["checksums_after_wrap"] = checksums(engine, model)
    torch.manual_seed(100 + rank)  # each rank its own batch: the step must still leave them equal
    batch = {
        "input_ids": torch.randint(0, 50, (4, 6)),
        "attention_mask": torch.ones(4, 6, dtype=torch.int64),
        "labels": torch.randint(0, 3, (4,)),
    }
    batch = {k: v.to(engine.device) for k, v in batch.items()}
    report["reduce_scatters"] = accumulate(engine, model, batch)
    engine.clip_and_step(model, optimizer, 1.0)
    report["checksums_after_step"] = checksums(engine, model)
    report["parameter_shapes"] = shapes
    report["state"] = model_state(engine, model, optimizer)
    report["evaluated_unevenly"] = evaluate_unevenly(engine, model)
    report["default_policy"] = type(engine.policy(model, optimizer, None, 100)) is RunPolicy
    report["joins_running_job"] = engine.joins_running_job(RunDirectory(out).read_config())
    return report


def main(engine_name: str, out: Path) -> None:
    # Two micro-steps per optimizer step (accumulate()), as Horovod's optimizer is told.
    engine = create_engine(RunConfig(training=TrainingArguments(engine=engine_name, gradient_accumulation_steps=2)))
    with engine.running():
        report = probe(engine, out)
    (out / f"rank-{report['rank']}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
