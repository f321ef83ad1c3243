"""horovod-train: one trainer, many data-parallel engines (Horovod, DDP, DataParallel)."""

__version__ = "0.1.0"
