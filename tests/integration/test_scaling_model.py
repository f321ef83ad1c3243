"""The scaling model of `bench project` (horovod_train/bench/models/project.py): its formulas on hand-computed cases,
the properties a step-time model must have, the published layer sizes, and the CLI's outputs. No launches."""

from __future__ import annotations

from dataclasses import replace

import pytest

from horovod_train.bench.buckets import ddp_buckets
from horovod_train.bench.models import layers, project
from horovod_train.bench.models.project import MB, Setting, Workload
from horovod_train.engines.communication import Buckets, FusionCycle

SETTINGS = [Setting("horovod", FusionCycle(), 128 * MB, cycle_time=1e-3), Setting("ddp", Buckets(), 25 * MB)]


def workload(model: str, compute: float = 0.25, batch: int = 32) -> Workload:
    return Workload(model, tuple(4 * n for n in layers.parameter_counts(model)), compute, batch)


def test_ddp_buckets_launch_as_their_last_gradient_is_ready_and_horovod_fuses_per_cycle():
    work = workload("bert-base-cased")
    modelled = project.ddp_buckets(work, SETTINGS[1])
    ready = project.ready_times(work)
    buckets = ddp_buckets(work.tensor_bytes, 25)  # DDP's own: tests/integration/test_ddp_buckets.py
    assert modelled == [(ready[last], nbytes) for last, nbytes in buckets] and len(modelled) > 1
    assert sum(nbytes for _, nbytes in modelled) == sum(work.tensor_bytes)
    fused = project.horovod_buckets(work, SETTINGS[0])
    assert sum(nbytes for _, nbytes in fused) == sum(work.tensor_bytes)
    assert all(launch / 1e-3 == pytest.approx(round(launch / 1e-3)) for launch, _ in fused)  # on cycle ticks
    assert all(nbytes <= SETTINGS[0].bucket_bytes for _, nbytes in fused)
    # A cycle longer than backward fuses everything in one round, into threshold-sized operations.
    one = project.horovod_buckets(work, replace(SETTINGS[0], cycle_time=work.compute, bucket_bytes=64 * MB))
    assert {launch for launch, _ in one} == {work.compute}
    assert all(nbytes <= 64 * MB or nbytes in work.tensor_bytes for _, nbytes in one) and len(one) <= -(
        -sum(work.tensor_bytes) // (32 * MB)
    )
    assert len(one) < len(fused)
