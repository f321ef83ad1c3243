"""A run's configuration, before anything heavy loads: run_config.py (the argument dataclasses and RunConfig, which
the engines import), parsing.py (train's arguments with the engine rows: the parser, --engine's check, --config
files; defaults < config file < command line), arguments.py (dataclasses -> command-line arguments), domains.py
(every argument's and environment variable's domain, values only, no I/O). Standard library and the registries'
names only: torch and transformers are not imported here (tests/unit/test_layout.py)."""
