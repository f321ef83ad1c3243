"""The Horovod engine: the engine itself, Horovod's environment knobs, and elastic Horovod."""

from horovod_train.engines.horovod.engine import HorovodEngine

__all__ = ["HorovodEngine"]
