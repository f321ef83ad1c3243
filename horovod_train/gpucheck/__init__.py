"""The GPU-node check (`scripts/gpu_check.sh`, `make gpu-check`, `python -m horovod_train.gpucheck`): a
product of its own, beside the training library and `horovod_train.bench`.

``check``: the steps, their checks and the report; ``nccl``: NCCL from torch's pip wheel for Horovod's build
(also imported by scripts/build_horovod.sh and scripts/build_horovod_nccl.sh before anything else of the
package is installed). Only the standard library and the package's stdlib-only helpers (files, tables,
errors) are imported: the check starts before the dependencies are installed, from a checkout or a wheel.
"""
