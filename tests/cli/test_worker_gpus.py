"""`splitserve worker --gpus`: the engine's CUDA_VISIBLE_DEVICES (its tensor x pipeline parallel devices) and
NIXL's UCX settings for GPU memory, as the worker re-execs itself with them; refusals are exit 2."""

from __future__ import annotations

import pytest
import typer

import cli.gpus
from cli.cmd_worker import _gpu_env
from services.worker.engines.vllm.ucx import CUDA_IPC_GET, GPU_UCX_TLS


@pytest.fixture(autouse=True)
def four_gpus(monkeypatch):
    monkeypatch.setattr(cli.gpus, "listed_gpus", lambda: (0, 1, 2, 3))
    monkeypatch.setattr(cli.gpus, "has_rdma_device", lambda: True)
    monkeypatch.delenv("UCX_TLS", raising=False)
    monkeypatch.delenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", raising=False)


@pytest.mark.parametrize(("gpus", "given", "devices"), [
    ("2,3", {"tensor_parallel_size": 2}, "2,3"),
    ("all", {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, "0,1,2,3"),
    ("1-3", {}, "1"),  # one device for a TP1 engine: the first named
])
def test_the_engine_gets_its_devices_and_ucx_for_gpu_memory(gpus, given, devices) -> None:
    assert _gpu_env(gpus, given) == {"CUDA_VISIBLE_DEVICES": devices, "UCX_TLS": GPU_UCX_TLS, **CUDA_IPC_GET}


def test_the_users_ucx_tls_wins(monkeypatch) -> None:
    monkeypatch.setenv("UCX_TLS", "rc,cuda_copy,cuda_ipc")
    assert _gpu_env("0", {}) == {"CUDA_VISIBLE_DEVICES": "0", **CUDA_IPC_GET}


@pytest.mark.parametrize(("gpus", "given"), [("4", {}), ("0,1", {"tensor_parallel_size": 4}), ("zero", {})])
def test_refusals_exit_2(gpus, given, capsys) -> None:
    with pytest.raises(typer.Exit) as exc:
        _gpu_env(gpus, given)
    assert exc.value.exit_code == 2 and "error:" in capsys.readouterr().err
