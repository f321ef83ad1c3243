"""The GPU-node check (`scripts/gpu_check.sh`, `make gpu-check`, `python -m horovod_train.gpucheck`): a
product of its own, beside the training library and `horovod_train.bench`.

``check``: the arguments and the run; ``steps``: the plan and its estimates; ``runner``: one step's process
group, log and timeout; ``checks``: what each step must show; ``report``: the files that come back;
``builds`` and ``wheels``: the two Horovod builds and the wheels kept for a later run; ``bundle``: what
`make gpu-bundle` carries; ``nccl``: NCCL from torch's pip wheel and this GPU's architecture (also imported by
scripts/build_horovod.sh and scripts/build_horovod_nccl.sh before anything else of the package is installed).
Only the standard library and the package's stdlib-only helpers (common/: files, tables, errors) are imported: the
check starts before the dependencies are installed, from a checkout or a wheel. ``node`` is the exception: the
programs its steps run in their own processes (torch, Horovod, transformers), which the check never imports.
"""
