"""The engines these tests make in the test process put vLLM's IPC socket files, and their torch.distributed
FileStore (``$TMPDIR/vllm_dist_<uuid>``, left behind by an engine that did not stop cleanly), in a directory of the
package's own, removed after it (a worker's own come from cli/engine_reaper.py's ``private_socket_dir``)."""

from __future__ import annotations

import getpass
import os
import shutil
import tempfile

import pytest

_KEYS = ("VLLM_RPC_BASE_PATH", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR")


@pytest.fixture(scope="package", autouse=True)
def _vllm_socket_dir():
    before = {key: os.environ.get(key) for key in _KEYS}
    path = tempfile.mkdtemp(prefix="splitserve-test-vllm-")  # reads (and caches) this process's temp dir first
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    # torch's compile cache keeps its usual place.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{user}"))
    # For the engine processes vLLM spawns; this process keeps its temp dir (pytest's tmp_path lives there).
    os.environ["VLLM_RPC_BASE_PATH"] = os.environ["TMPDIR"] = path
    try:
        yield path
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(path, ignore_errors=True)
