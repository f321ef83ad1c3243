"""`horovod-train build-horovod`: Horovod 0.28.1 built from its sdist for the environment it runs in.

The one place the build lives: what the environment has (target.py), what is missing (toolchain.py), the NCCL
and GPU architectures of a CUDA build (nccl.py, gpu.py), the plan and its cache key (plan.py), the patched build
and the wheel cache (build.py), the install and --check-build (install.py), the long steps' progress lines
(progress.py), the command (command.py).
Standard library only (tests/unit/test_build_horovod.py checks it): scripts/build_horovod.sh runs
`python -m horovod_train.build_horovod` in environments that hold torch but none of this package's dependencies
(the NCCL build's venv, an image's early layer).
"""
