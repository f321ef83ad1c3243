# Two commands for a new user: `make demo` (the main job) and `make test` (the whole suite).
# Both run `make setup` first, which installs whatever is missing (idempotent).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 2
PYTEST_ARGS ?=

.PHONY: setup demo test lint clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(VENV)/bin/horovodrun -np $(NP) --gloo $(PY) -m horovod_train train --config configs/demo.yaml \
		--overwrite_output_dir

test: setup
	@$(VENV)/bin/ruff check horovod_train tests
	@PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	@$(VENV)/bin/ruff check horovod_train tests
	@$(VENV)/bin/ruff format --check horovod_train tests

clean:
	rm -rf runs .pytest_cache
