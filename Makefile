# One Makefile for the whole loop. `make demo` and `make test` bootstrap .venv from the lock file first.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Parallel test workers (pytest-xdist, docs/testing.md "Parallel workers"). 0, the default, runs in one
# process: on the 2-core CI machine three workers measured slower than one process (the suite is CPU-bound).
TEST_WORKERS ?= 0
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup)
BENCH_ARGS ?=
# Caches that outlive a clean clone, each in a folder named after its content key (docs/testing.md
# "Caches"): mypy's here, the infra tools venv (scripts/infra_tools.sh), the images' uv cache
# (tests/integration/podman.py). A missing or stale key builds afresh.
MLOPS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mlops-fraud
export MLOPS_CACHE

.PHONY: help install demo up down test test-costs test-fast lint format bench bench-e2e bench-e2e-quick lock lock-gpu doctor clean clean-cache

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The virtual environment is rebuilt when the lock or the project metadata changes.
$(STAMP): requirements.lock pyproject.toml scripts/bootstrap.sh
	@PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/bootstrap.sh
	@touch $@

install: $(STAMP) ## create or refresh .venv from requirements.lock

demo: $(STAMP) ## run the main job through Airflow on the embedded stack (left up: make down)
	$(BIN)/mlops demo

up: $(STAMP) ## start Airflow and the MLflow UI in the background; prints URLs and login
	@bash scripts/up.sh

down: $(STAMP) ## stop what `make up` started
	@bash scripts/down.sh

test: $(STAMP) ## run every test tier (TEST_WORKERS=N: on N parallel workers)
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

# Serial on purpose: a group's cost is its own seconds, not its share of a crowded machine. Run it on a quiet day.
test-costs: $(STAMP) ## run every tier in one process and record each test group's seconds (tests/group_costs.json)
	MLOPS_TEST_GROUP_COSTS=tests/group_costs.json $(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP) ## the fast tier (unit, data, dags): seconds
	$(BIN)/python -m pytest -m "unit or data or dags" $(PYTEST_ARGS)

lint: $(STAMP) ## ruff (with Airflow 3 AIR rules), a format check, and mypy (config in pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@key=$$( { cat requirements.lock; $(BIN)/python --version; } | sha256sum | cut -c1-16); \
	  echo "lint: mypy cache key $$key -> $(MLOPS_CACHE)/mypy-$$key"; \
	  MYPY_CACHE_DIR=$(MLOPS_CACHE)/mypy-$$key $(BIN)/mypy

format: $(STAMP) ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(STAMP) ## benchmarks: ratios against baselines measured in the same run
	$(BIN)/python -m benchmarks

bench-e2e: $(STAMP) ## arrival -> gate decision through Airflow at 1M rows/day x 30 days (a long set-up first: docs/benchmarks.md)
	$(BIN)/python -m benchmarks --only end_to_end $(BENCH_ARGS)

bench-e2e-quick: $(STAMP) ## the same at 200k rows/day x 30 days, set-up kept in var/bench/e2e-setup; BASELINE=<rev> adds before/after
	$(BIN)/python -m benchmarks --only end_to_end --sizes 200000 --history-days 30 --setup-dir var/bench/e2e-setup \
	  $(if $(BASELINE),--baseline-commit $(BASELINE)) $(BENCH_ARGS)

doctor: $(STAMP) ## check Java, Spark and the active profile's services
	$(BIN)/mlops doctor

lock: ## re-resolve pyproject.toml into requirements.lock (needs the network's package registry)
	@PYTHON=$(PYTHON) bash scripts/lock.sh

lock-gpu: $(STAMP) ## pin the CUDA build of the locked torch and its wheels in requirements-gpu.lock (needs the registry)
	$(BIN)/python scripts/lock_gpu.py

clean: ## remove .venv and local state (var/)
	rm -rf $(VENV) var .pytest_cache .ruff_cache .mypy_cache

clean-cache: ## remove the caches kept outside the clone ($(MLOPS_CACHE))
	rm -rf $(MLOPS_CACHE)
