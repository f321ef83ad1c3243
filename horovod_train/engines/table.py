"""The engine table: ``--engine`` name -> the class that implements it, as "module:Class" (the form of a package's
entry point). Adding an engine is adding an ``Engine`` subclass (engines/base.py) and a row here. Nothing is
imported: the argument checks (domains.py) read the names, ``engines.create_engine`` loads a class on first use."""

ENGINE_CLASSES = {
    "ddp": "horovod_train.engines.ddp:DDPEngine",
    "dp": "horovod_train.engines.dp:DataParallelEngine",
    "horovod": "horovod_train.engines.horovod:HorovodEngine",
    "single": "horovod_train.engines.single:SingleEngine",
}
ENGINE_NAMES = tuple(ENGINE_CLASSES)
