"""The helpers every wing uses, standard library only (the GPU check and build-horovod import them before any
dependency is installed): errors.py (UsageError: the one-line refusal, exit 2), console.py (rank 0's lines),
files.py (atomic writes, the umask's mode), tables.py (plain-text tables), digest.py (a file's SHA-256)."""
