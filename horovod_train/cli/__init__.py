"""The command line: what a user types. main.py is the `horovod-train` command (its subcommands' table, `train`),
compare.py runs one job under every engine side by side (`compare`, and the runs `bench train` measures),
doctor.py prints the rank/host/device map and Horovod's build (`doctor`). The commands parse and dispatch; what
they run lives in the other wings."""
