"""Rank 0 reads (files may be on rank 0's node alone) or works first, and every rank gets its result or
raises its error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from horovod_train.common.errors import UsageError
from horovod_train.engines.base import Engine


class RankZero:
    def __init__(self, engine: Engine, joining: bool = False) -> None:
        self.engine = engine
        # A worker that an engine adds to a running job: the others are training, so its setup takes part in
        # no collective, and it writes nothing.
        self.joining = joining

    def read_for_all(self, read: Callable[[], Any]) -> Any:
        """Rank 0 reads and every rank gets the result, or raises the same error."""
        payload: Any = None
        if self.engine.is_main:
            try:
                payload = read()
            except UsageError as error:
                payload = error
        payload = self.engine.broadcast_object(payload)
        if isinstance(payload, UsageError):
            raise payload
        return payload

    def first(self, work: Callable[[], None]) -> None:
        """Rank 0 does ``work`` before any other rank goes on, and its error is every rank's. An engine whose
        setup has no collective (workers join a running job): rank 0 alone, in the job's first setup."""
        if self.engine.collective_setup:
            self.read_for_all(work)
        elif self.engine.is_main and not self.joining:
            work()

    def read_in_setup(self, read: Callable[[], Any]) -> Any:
        """``read_for_all`` where setup may use collectives; else every rank reads for itself."""
        return self.read_for_all(read) if self.engine.collective_setup else read()
