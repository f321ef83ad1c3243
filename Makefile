# Two commands for a new user: `make demo` (the main job) and `make test` (the whole suite: about 36 min from
# nothing, 28 with warm caches, on 2 cores; docs/launch.md). Both run `make setup` first, which installs whatever is
# missing (idempotent): the first time it compiles Horovod (25.8 min in all on 2 cores under a load of 9-10,
# docs/setup.md), then it takes seconds. `make test-fast` runs the in-process tier alone
# (tests/unit: 5.6 min on 2 cores under a load of 6-8, README.md): the loop to run while changing code.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 2
# Horovod's controller for `make demo`: mpi (horovodrun runs mpirun; the fastest on CPU: shared-memory
# transport, about 1.05x DDP on the demo against gloo's 0.75x, see docs/performance.md) or gloo.
CONTROLLER ?= mpi
# More training arguments for `make demo` (they win over configs/demo.yaml): DEMO_ARGS="--output_dir runs/mine".
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup demo test test-gpu-image test-fast lint clean bench gpu-check gpu-bundle nccl-build

setup:
	@bash scripts/setup.sh

demo: setup
	@$(VENV)/bin/horovodrun -np $(NP) --$(CONTROLLER) $(PY) -m horovod_train train --config configs/demo.yaml \
		--overwrite_output_dir $(DEMO_ARGS)

# The whole suite: tests/unit (in-process), tests/integration (real ranks on this machine), tests/system
# (Podman images, the GPU image among them, SLURM clusters, network namespaces, the NCCL build), after the
# system tools they drive.
# scripts/test.sh runs setup, the test tools, lint and pytest, then prints where the time went.
test:
	@VENV="$(abspath $(VENV))" PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/test.sh all

# The GPU image's tests alone (also in `make test`): builds it with Podman here, no GPU and no registry needed,
# and checks it (tests/system/test_gpu_image.py; docs/launch.md).
test-gpu-image: setup
	@bash scripts/install_test_tools.sh
	@PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest tests/system/test_gpu_image.py $(PYTEST_ARGS)

test-fast:
	@VENV="$(abspath $(VENV))" PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/test.sh fast

bench: setup  # samples/s per engine and Horovod/DDP ratios: the demo job, then BERT-base's size (about 5 minutes)
	@$(PY) -m horovod_train bench train --repeats 3 --output_dir runs/bench/train --overwrite_output_dir
	@$(PY) -m horovod_train bench train --model_size bert-base --repeats 3 --output_dir runs/bench/train-bert-base \
		--overwrite_output_dir

# On a GPU node, no network: the node's facts, Horovod built offline, then the GPU paths most valuable first within
# --budget_s (default 8 minutes; docs/performance.md gives the command for a lent machine). GPU_CHECK_ARGS=--dry-run
# runs the plumbing on CPU, --plan-only prints the plan. `make gpu-bundle` (with network) makes the folder it
# needs: at most 50 MiB, printing what it leaves out.
gpu-check:
	@bash scripts/gpu_check.sh $(GPU_CHECK_ARGS)

gpu-bundle:
	@bash scripts/gpu_bundle.sh

# No GPU needed, nvcc (CUDA 13) is: Horovod with NCCL against PyPI's CUDA torch, in its own environment cached in
# ~/.cache/horovod-train (not .venv), then --check-build must list NCCL (docs/launch.md; tests/system/test_nccl_build.py).
nccl-build:
	@bash scripts/build_horovod_nccl.sh

lint: setup
	@$(VENV)/bin/ruff check horovod_train tests
	@$(VENV)/bin/ruff format --check horovod_train tests

clean:
	rm -rf runs .pytest_cache
