"""No /dev/shm leftovers and no socket files from vLLM workers, however they stop: a real `up` graph (1 prefill
+ 1 decode vLLM worker, kvtier), /dev/shm and the temporary directory listed before it starts and after each stop.

vLLM's IPC socket files (``ipc://$TMPDIR/<uuid>``, five an engine) were never removed: 1,500 in /tmp after one
test suite. Each worker now gives vLLM a directory of its own that its engine reaper removes.

Leaked: a file in /dev/shm after that was not there before and that no live process maps (told by inode: a
semaphore's creator maps it under a deleted temporary name, cli/engine_reaper.py). Before cli/shm_tracker.py,
multiprocessing's named semaphores of vLLM's engine processes (sem.mp-*) stayed after each of these: their
resource tracker, a plain child of the worker, was SIGKILLed with the worker's group (`up`) or by the engine
reaper before it unlinked them.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import stat
import tempfile

import httpx
import pytest

from cli.engine_reaper import shm_inodes_mapped
from cli.shm_tracker import run_dir
from tests.harness.graph import start_graph, wait_until, worker_stats

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]

SHM = "/dev/shm"


def _listing() -> dict[str, int]:
    """{path: inode} of /dev/shm now."""
    out = {}
    for name in os.listdir(SHM):
        try:
            out[f"{SHM}/{name}"] = os.stat(f"{SHM}/{name}").st_ino
        except OSError:
            continue
    return out


def leaked(before: dict[str, int]) -> list[str]:
    mapped: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            mapped |= shm_inodes_mapped(entry)
    return sorted(p for p, ino in _listing().items() if before.get(p) != ino and ino not in mapped)


def _sockets() -> set[str]:
    """Socket files, worker socket directories and vLLM's FileStore files (``vllm_dist_<uuid>``, one a killed
    engine before each worker's tree got its own TMPDIR) in the temporary directory now."""
    tmp = tempfile.gettempdir()
    out = set()
    for name in os.listdir(tmp):
        try:
            mode = os.lstat(os.path.join(tmp, name)).st_mode
        except OSError:
            continue
        if stat.S_ISSOCK(mode) or (stat.S_ISDIR(mode) and name.startswith("splitserve-vllm-")) \
                or name.startswith("vllm_dist_"):
            out.add(name)
    return out


def _restarted(graph, old: int) -> bool:
    if graph.pids().get("worker-prefill-0") in (None, old):
        return False
    try:  # the router lists it again, and it answers at the endpoint it registered
        return "prefill-0" in worker_stats(graph.router)
    except Exception:
        return False


def _complete(graph, prompt: str) -> str:
    resp = httpx.post(graph.url + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 4},
                      timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["text"]


def test_no_shm_left_after_worker_kill_9_sigterm_and_up_stop(tmp_path) -> None:
    before = _listing()
    sockets_before = _sockets()
    graph = start_graph(tmp_path, "--engine", "vllm", "--dtype", "float32")
    try:
        _complete(graph, "a prompt long enough " * 20)  # every engine process has made what it makes
        assert {p for p, ino in _listing().items() if before.get(p) != ino}, "vLLM made nothing in /dev/shm here"

        # kill -9 of a worker (the OOM killer): `up` restarts it; what the dead tree made is gone.
        old = graph.pids()["worker-prefill-0"]
        os.kill(old, signal.SIGKILL)
        assert wait_until(lambda: _restarted(graph, old), timeout_s=300, interval_s=1.0), graph.logs()[-4000:]
        _complete(graph, "after the restart " * 20)
        assert wait_until(lambda: not leaked(before), timeout_s=30, interval_s=0.5), leaked(before)
        # The two live workers' socket directories, none of the killed one's.
        assert wait_until(lambda: len(_sockets() - sockets_before) == 2, timeout_s=30, interval_s=0.5), \
            _sockets() - sockets_before

        # SIGTERM of a worker (an operator's drain): it finishes, exits 0, `up` lets it go.
        decode = graph.pids()["worker-decode-1"]
        os.kill(decode, signal.SIGTERM)
        assert wait_until(lambda: "worker-decode-1" not in graph.pids(), timeout_s=120, interval_s=0.5)
        assert wait_until(lambda: not leaked(before), timeout_s=30, interval_s=0.5), leaked(before)
    finally:
        graph.stop()
    # `up` stopped (SIGTERM to the launcher): nothing of the graph is left, and no tracker record.
    assert wait_until(lambda: not leaked(before), timeout_s=30, interval_s=0.5), leaked(before)
    assert wait_until(lambda: not _sockets() - sockets_before, timeout_s=30, interval_s=0.5), \
        _sockets() - sockets_before
    mine = [r for r in run_dir().glob("*.names") if not os.path.exists(f"/proc/{r.stem}")]
    assert not mine, mine
