"""Engine.broadcast_object for checkpoints of any size: a >2 GiB tensor from rank 0 reaches every rank exactly
under each real launcher, with one copy of the payload per rank; small payloads and errors still travel."""

from __future__ import annotations

import pytest
import torch
from probes import broadcast_probe
from support.checks import threads_broadcast

from horovod_train.common.errors import UsageError
from horovod_train.config.run_config import RunConfig, TrainingArguments
from horovod_train.engines import create_engine
from horovod_train.engines.payload import CHUNK_BYTES


@pytest.mark.parametrize("chunk_bytes", [7, CHUNK_BYTES])  # chunks that split elements; one chunk per tensor
def test_small_payload_between_ranks(chunk_bytes):
    sent = broadcast_probe.payload(gib=1e-6)
    received = threads_broadcast([sent, None, None], chunk_bytes)
    assert received[0] is sent
    for got in received[1:]:
        assert all(broadcast_probe.check(got).values()), broadcast_probe.check(got)
        assert got["shared"][0] is got["shared"][1]  # one tensor twice stays one tensor
        assert got["model"]["small"]["transposed"].is_contiguous()


def test_broadcast_usage_error():
    error = UsageError("checkpoint is corrupted", "resume from an earlier checkpoint")
    for got in threads_broadcast([error, None], CHUNK_BYTES):
        assert type(got) is UsageError and (got.problem, got.fix, str(got)) == (error.problem, error.fix, str(error))


def test_one_process_engine_returns_the_object():
    engine = create_engine(RunConfig(training=TrainingArguments(engine="single")))
    sent = {"tensor": torch.ones(3), "error": UsageError("a", "b")}
    assert engine.broadcast_object(sent) is sent
