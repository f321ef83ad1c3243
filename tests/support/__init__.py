"""Helpers shared by the tests: jobs (launch the CLI), launch (the launch/ scripts), slurm (a real
cluster), metrics (recompute a run's metrics), processes (find and wait for ranks), checks."""
