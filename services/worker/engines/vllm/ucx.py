"""UCX settings for NIXL when a vLLM engine's KV cache is in GPU memory (pure: the caller passes the environment).

NIXL moves KV through UCX, which picks a transport per memory type and peer. For KV in VRAM: ``cuda_ipc`` READs
another process's GPU memory on the same host (NVLink or PCIe peer access, no host copy), ``cuda_copy`` stages
device <-> host memory (VRAM to a host peer: the kvtier's DRAM pool), ``rc`` (InfiniBand / RoCE verbs, GPUDirect
RDMA where the driver has it) reaches other hosts, ``tcp`` is the fallback between hosts without RDMA, ``sm``
(shared memory: posix, cma) and ``self`` carry host-memory peers on this host (kvtier's pool, UCX's own
wire-up). ``rc`` is listed only where the machine has an RDMA device (``has_rdma``, the caller reads
/sys/class/infiniband): UCX warns once per process about every listed transport it cannot find.

``cuda_ipc`` serves a PUT (a push's WRITE) always, but a GET (a pull's READ) only where UCX finds NVLink
(``UCX_CUDA_IPC_ENABLE_GET_ZCOPY=auto``: concurrent reads over PCIe ran slower than puts in UCX's tests): on a
GPU without NVLink peers the READ falls back to UCX's software emulation over TCP. Measured on one H200 (no
NVLink peer), two processes, 288 MiB of KV in 2,304 descriptors: 0.70 GB/s against 1,898 GB/s for a device
copy (docs/gpus.md#the-gpu-check). vLLM's pull connector has the same trap (vLLM issue 52607: 0.5 GB/s pull
against 49 GB/s push on one node); NIXL turned GET on in its UCX plugin after 1.5.1. We set it ``on``: a READ
over PCIe peer access at some loss to a WRITE still beats TCP emulation by orders of magnitude.

The user's own UCX_* variables win, each one: ``gpu_ucx_env`` only adds those they did not set, and warns when
their UCX_TLS is an inclusion list with no CUDA transport (UCX then cannot touch GPU memory; NIXL fails to
register VRAM or falls back to nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# The order is UCX's preference only where it has no better measure; it chooses lanes by its own bandwidth model.
GPU_UCX_TLS = "cuda_copy,cuda_ipc,rc,sm,self,tcp"
GPU_UCX_TLS_NO_RDMA = "cuda_copy,cuda_ipc,sm,self,tcp"
# A pull's READ over cuda_ipc without NVLink (UCX's "auto" turns it off there; see above).
CUDA_IPC_GET = {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "on"}
CUDA_TRANSPORTS = ("cuda_copy", "cuda_ipc", "cuda")  # "cuda" is UCX's alias for both


@dataclass(frozen=True, slots=True)
class UcxSettings:
    env: dict[str, str]  # to add to the worker's environment (before vLLM's NIXL agent starts)
    kept: tuple[str, ...] = ()  # the user's own UCX_* variables that replaced ours
    warning: str = ""


def gpu_ucx_env(on_cuda: bool, user_env: Mapping[str, str], has_rdma: bool = True) -> UcxSettings:
    """What the worker sets for NIXL: nothing on CPU (UCX's defaults, measured here: docs/architecture.md)."""
    if not on_cuda:
        return UcxSettings(env={})
    ours = {"UCX_TLS": GPU_UCX_TLS if has_rdma else GPU_UCX_TLS_NO_RDMA, **CUDA_IPC_GET}
    kept = tuple(sorted(k for k in ours if k in user_env))
    warning = ""
    tls = user_env.get("UCX_TLS", "")
    if tls and not tls.startswith("^") and tls != "all":
        names = {t.strip() for t in tls.split(",")}
        if not names & set(CUDA_TRANSPORTS):
            warning = (f"UCX_TLS={tls} has no CUDA transport: NIXL cannot move KV in GPU memory; add "
                       f"cuda_copy,cuda_ipc (splitserve's default is {GPU_UCX_TLS})")
    return UcxSettings(env={k: v for k, v in ours.items() if k not in user_env}, kept=kept, warning=warning)
