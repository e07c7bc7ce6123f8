"""The engines these tests make in the test process put vLLM's IPC socket files in a directory of the package's
own, removed after it (a worker's own come from cli/engine_reaper.py's ``private_socket_dir``)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest


@pytest.fixture(scope="package", autouse=True)
def _vllm_socket_dir():
    before = os.environ.get("VLLM_RPC_BASE_PATH")
    path = tempfile.mkdtemp(prefix="splitserve-test-vllm-")
    os.environ["VLLM_RPC_BASE_PATH"] = path
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop("VLLM_RPC_BASE_PATH", None)
        else:
            os.environ["VLLM_RPC_BASE_PATH"] = before
        shutil.rmtree(path, ignore_errors=True)
