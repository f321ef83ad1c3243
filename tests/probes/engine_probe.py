"""Started under a real launcher by tests/integration/test_engine_contract.py: drives one engine through the interface
the trainer uses and writes what this rank saw to OUT/rank-<rank>.json.

Usage: python tests/probes/engine_probe.py ENGINE OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import BertConfig, BertForSequenceClassification

from horovod_train.config import RunConfig, TrainingArguments
from horovod_train.engines import create_engine
from horovod_train.engines.policy import RunPolicy
from horovod_train.model import param_checksum


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
    local = torch.tensor([param_checksum(engine.unwrap(model))], dtype=torch.int64, device=engine.device)
    return engine.all_gather(local).cpu().tolist()


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
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = engine.wrap(model, optimizer)
    report["checksums_after_wrap"] = checksums(engine, model)
    torch.manual_seed(100 + rank)  # each rank its own batch: the step must still leave them equal
    batch = {
        "input_ids": torch.randint(0, 50, (4, 6)),
        "attention_mask": torch.ones(4, 6, dtype=torch.int64),
        "labels": torch.randint(0, 3, (4,)),
    }
    batch = {k: v.to(engine.device) for k, v in batch.items()}
    with engine.accumulation_context(model, is_last_micro_step=True):
        engine.forward_loss(model, batch).backward()
    engine.clip_and_step(model, optimizer, 1.0)
    report["checksums_after_step"] = checksums(engine, model)
    report["default_policy"] = type(engine.policy(model, optimizer, None, 100)) is RunPolicy
    report["joins_running_job"] = engine.joins_running_job(str(out))
    return report


def main(engine_name: str, out: Path) -> None:
    engine = create_engine(RunConfig(training=TrainingArguments(engine=engine_name)))
    with engine.running():
        report = probe(engine, out)
    (out / f"rank-{report['rank']}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
