"""Launching: how each launcher (horovodrun, mpirun, torchrun, srun, plain python) writes its command line
(commands.py; ``python -m horovod_train.launching`` prints it for the launch/ scripts) and how a process
started by one finds its rank, local rank, world size and master address (environment.py). Standard library only."""
