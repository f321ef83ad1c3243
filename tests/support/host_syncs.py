"""Shared by the host-sync tests."""

from __future__ import annotations

import pytest

from horovod_train.engines.single import SingleEngine


@pytest.fixture
def offline_cache(cache_dir, monkeypatch):
    monkeypatch.setenv("HOROVOD_TRAIN_CACHE", str(cache_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


class NaNFromStep(SingleEngine):
    """Single engine whose loss turns NaN at the 5th micro-batch (step 5): a diverging run."""

    calls = 0

    def forward_loss(self, model, batch, label_smoothing=0.0):
        loss = super().forward_loss(model, batch, label_smoothing)
        NaNFromStep.calls += 1
        return loss * float("nan") if NaNFromStep.calls >= 5 else loss
