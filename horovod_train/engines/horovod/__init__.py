"""The Horovod engine: the engine itself, its options, Horovod's environment knobs, and elastic Horovod.

``HorovodEngine`` is imported on first use: config.py imports ``options``, and the engine imports config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from horovod_train.engines.horovod.engine import HorovodEngine

__all__ = ["HorovodEngine"]


def __getattr__(name: str) -> Any:
    if name == "HorovodEngine":
        from horovod_train.engines.horovod.engine import HorovodEngine

        return HorovodEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
