"""Data: hub datasets, save_to_disk directories, local files and synthetic-nli, all through one
validate/tokenize/collate path, in the order a run takes them: sources.py (the examples as given),
columns.py (text columns and ``label``), labels.py (the task's shape, label names, encoded labels),
splits.py (train, validation and test splits: ``load_raw_datasets``), tokenize.py (the tokenized cache and
its digests), loaders.py (samplers, loaders, collators). Text columns and label names are resolved as
transformers' run_glue.py and run_classification.py do. The datasets the project knows by name: glue.py (GLUE's
tasks, hub and save_to_disk sources), glue_files.py (GLUE's distributed .tsv layouts), synthetic.py
(synthetic-nli, generated, no download)."""
