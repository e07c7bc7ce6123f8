"""NIXL's UCX settings for KV in GPU memory (ucx.py): set on CUDA only, the user's own UCX_* win."""

from __future__ import annotations

import pytest

from services.worker.engines.vllm.ucx import CUDA_IPC_GET, GPU_UCX_TLS, GPU_UCX_TLS_NO_RDMA, gpu_ucx_env

GET = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"


@pytest.mark.parametrize(("on_cuda", "user_env", "env", "kept", "warns"), [
    (False, {}, {}, (), False),  # CPU: UCX's defaults
    (True, {}, {"UCX_TLS": GPU_UCX_TLS, GET: "on"}, (), False),
    (True, {"UCX_TLS": "rc,cuda_copy"}, {GET: "on"}, ("UCX_TLS",), False),  # theirs, with a CUDA transport
    (True, {"UCX_TLS": "tcp,self"}, {GET: "on"}, ("UCX_TLS",), True),  # theirs, but it cannot touch GPU memory
    (True, {"UCX_TLS": "^ud"}, {GET: "on"}, ("UCX_TLS",), False),  # an exclusion list keeps the CUDA transports
    (True, {GET: "auto"}, {"UCX_TLS": GPU_UCX_TLS}, (GET,), False),  # UCX's own NVLink rule, if they ask for it
    (True, {"UCX_NET_DEVICES": "mlx5_0:1"}, {"UCX_TLS": GPU_UCX_TLS, GET: "on"}, (), False),  # others left as set
])
def test_gpu_ucx_env(on_cuda, user_env, env, kept, warns) -> None:
    settings = gpu_ucx_env(on_cuda, user_env)
    assert (settings.env, settings.kept, bool(settings.warning)) == (env, kept, warns)


def test_gpu_transports_cover_device_memory_on_and_across_hosts() -> None:
    names = GPU_UCX_TLS.split(",")
    assert {"cuda_copy", "cuda_ipc"} <= set(names)  # VRAM <-> host, VRAM <-> VRAM on one host
    assert {"rc", "tcp"} <= set(names)  # across hosts: RDMA, else TCP


def test_no_rdma_device_no_rc() -> None:
    # UCX warns about each listed transport it cannot find: without an HCA, rc is not listed.
    assert gpu_ucx_env(True, {}, has_rdma=False).env == {"UCX_TLS": GPU_UCX_TLS_NO_RDMA, **CUDA_IPC_GET}
    assert "rc" not in GPU_UCX_TLS_NO_RDMA.split(",") and "tcp" in GPU_UCX_TLS_NO_RDMA.split(",")


def test_a_pull_can_read_over_cuda_ipc_without_nvlink() -> None:
    # UCX's "auto" turns cuda_ipc GET off without NVLink; a READ then crawls over TCP (docs/gpus.md).
    assert gpu_ucx_env(True, {}).env[GET] == "on" and GET not in gpu_ucx_env(False, {}).env
