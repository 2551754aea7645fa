# gpushare — `make test` installs everything a fresh machine needs, then runs every tier.
# Expensive builds (containerd, Kubernetes, kernels) are cached outside the repo, in
# $GPUSHARE_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/gpushare, as hack/*.sh and localcluster.paths).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

export GPUSHARE_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gpushare
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

# Each part's makefile fragment appends its install step to DEPS (mk/*.mk).
DEPS :=

.PHONY: help venv deps lint unit test protos clean
help:
	@echo "make test     install everything, lint, run unit, property and integration tests;"
	@echo "              any skipped test fails it, unless its tier is named in GPUSHARE_ALLOW_SKIP"
	@echo "              (e.g. GPUSHARE_ALLOW_SKIP=\"kernel containerd\"; tiers: unit, property, tests/integration/*)"
	@echo "make demo     bring up a one-node cluster with fake GPUs and walk through gpushare"
	@echo "make lint     ruff, mypy and the import-layer contracts"
	@echo "make protos   regenerate the committed protobuf stubs"

$(VENV)/.installed: pyproject.toml
	@command -v python3 >/dev/null || { echo "python3 >= 3.11 is required"; exit 1; }
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

include $(sort $(wildcard mk/*.mk))

deps: venv $(DEPS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(MAKE) -s helm-lint

unit: venv
	$(PY) -m pytest tests/unit tests/property -q $(PYTEST_ARGS)

# Unit and property tests first, integration (real peers) last, as kopf does. tests/conftest.py fails
# the run on any skip outside the tiers named in GPUSHARE_ALLOW_SKIP, prints each tier's time, and
# puts each tier in one of TEST_LANES lanes that run side by side, one worker each.
TEST_LANES := 3
test: deps lint
	$(PY) -m pytest tests -q -n $(TEST_LANES) --dist loadgroup $(PYTEST_ARGS)

protos: venv
	$(PY) hack/protos.py

clean:
	rm -rf build *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
