"""The engine contract, checked over every engine under its real launcher: what the trainer relies on
(ranks, exact collectives, rank-0 broadcast, local-main-first, identical replicas after wrap and after a
step, the default policy) holds for each of them."""

from __future__ import annotations

from support.engine_contract import LAUNCHES

from horovod_train.engines import available_engines


def test_every_engine_has_a_contract_launch():
    assert {engine for engine, _ in LAUNCHES.values()} == set(available_engines())
