"""The command line: what a user types. main.py is the `horovod-train` command (its subcommands' table, `train`),
doctor.py prints the rank/host/device map and Horovod's build (`doctor`). The commands parse and dispatch; what
they run lives in the other wings (`compare`'s runs are launching/compare.py's, which bench measures too)."""
