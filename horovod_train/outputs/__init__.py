"""What a run leaves on disk, and its one owner: run_directory.py (the --output_dir: lock, ledger, what is the
run's own, fresh or in-place starts), checkpoint.py and checkpoint_layout.py (atomic, verified checkpoints,
rotation, latest/auto), checkpoint_convert.py and checkpoint_trainer.py (`horovod-train checkpoint`: another
form), transformers_files.py (the files transformers' tools read), trackers.py (--report_to) and checksums.py (the
parameters' digest). The stdlib-only helpers they write with (atomic writes, rank 0's lines) are common/'s."""
