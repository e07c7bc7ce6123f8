"""Workers restarted against a warm kvtier, and a worker whose engine core dies, on one `make serve` graph.

Workers restarted against a warm kvtier: the `make serve` graph (1 prefill + 1 decode vLLM worker, push, kvtier
on) whose workers are killed and restarted by `up` serves a prompt whose KV only the tier holds, on the decode
worker, and keeps serving. It did not: the tier connector's first load beside NIXL killed vLLM's engine (its
Prometheus logger asserted on the tier's stats), and every later request got a 503.

Every prompt prefills on the decode worker (--local-prefill-max-tokens), so the tier hit is the decode engine's,
under the same MultiConnector (NixlPushConnector + the tier) as `up`'s defaults.

Then the prefill worker's vLLM engine core is killed -9 (the worker process lives on): the worker deregisters at
once and exits for `up` to restart it, /health says "degraded" while the prefill pool is empty (requests are
served, prefilled on the decode worker), and "ok" again once the restarted worker registers. Before, the worker
stayed registered and "responding" with a dead engine, /health said 200 "ok", and its requests got 503s."""

from __future__ import annotations

import importlib.util
import os
import signal

import httpx
import psutil
import pytest

from tests.harness.graph import start_graph, wait_until, worker_ids, worker_stats
from tests.e2e.test_kvtier_mock import _settled, _tier_up, tier_stats
from tests.e2e.test_kvtier_vllm import BLOCK, FILLERS, PREFIX, complete

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]

WORKERS = ("worker-prefill-0", "worker-decode-1")


def _restarted(graph, old: dict[str, int]) -> bool:
    pids = graph.pids()
    if any(pids.get(name) in (None, old[name]) for name in WORKERS):
        return False
    try:  # the router lists both, and each answers at the endpoint it registered (the old ones are dead)
        return set(worker_stats(graph.router)) == {"prefill-0", "decode-1"}
    except Exception:
        return False


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    graph = start_graph(tmp_path_factory.mktemp("restart"), "--engine", "vllm", "--dtype", "float32",
                        "--local-prefill-max-tokens", "100000", "--host-cache-gb", "0.05")
    yield graph
    graph.stop()


def test_warm_tier_hit_on_the_decode_worker_after_both_workers_restart(graph) -> None:
    assert wait_until(lambda: _tier_up(graph), timeout_s=20), graph.logs()[-3000:]
    reference, cached = complete(graph, PREFIX)  # computed by the decode engine, written through to kvtier
    assert cached == 0
    _settled(graph)
    before = tier_stats(graph)
    assert before.blocks_stored >= 8
    old = graph.pids()
    for name in WORKERS:
        os.kill(old[name], signal.SIGKILL)
    assert wait_until(lambda: _restarted(graph, old), timeout_s=300, interval_s=1.0), graph.logs()[-5000:]
    restarted = graph.pids()
    # The fresh decode engine has none of P: all 8 blocks come from the warm tier.
    assert complete(graph, PREFIX) == (reference, 8 * BLOCK)
    after = tier_stats(graph)
    assert after.hits_host - before.hits_host == 8 and after.checksum_failures == 0
    for filler in FILLERS[:2]:  # fresh prompts after the tier hit: the engine is alive
        assert complete(graph, filler)[1] == 0
    assert httpx.get(graph.url + "/health", timeout=5).status_code == 200
    assert {name: graph.pids()[name] for name in WORKERS} == {name: restarted[name] for name in WORKERS}
    logs = graph.logs()
    assert "registered connectors with Prometheus" not in logs and "EngineDeadError" not in logs


def _engine_core(worker_pid: int) -> psutil.Process:
    """The worker's vLLM engine core: the child process vLLM titles EngineCore."""
    cores = [p for p in psutil.Process(worker_pid).children(recursive=True)
             if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()]
    assert len(cores) == 1, [(p.pid, p.name(), p.cmdline()) for p in psutil.Process(worker_pid).children(True)]
    return cores[0]


def test_dead_engine_core_deregisters_its_worker_health_degrades_then_recovers(graph) -> None:
    def health() -> tuple[int, dict]:
        resp = httpx.get(graph.url + "/health", timeout=5)
        return resp.status_code, resp.json()

    assert health()[1]["status"] == "ok"
    worker_pid = graph.pids()["worker-prefill-0"]
    _engine_core(worker_pid).kill()
    # The router stops listing it (the worker said so; its heartbeat timeout is seconds away), and the worker
    # process exits (status 3) for `up` to start a fresh one. Asked the router only: the dying worker itself need
    # not answer a GetStats on its way out.
    assert wait_until(lambda: "prefill-0" not in worker_ids(graph.router), timeout_s=10, interval_s=0.1)
    assert wait_until(lambda: not psutil.pid_exists(worker_pid) or
                      psutil.Process(worker_pid).status() == psutil.STATUS_ZOMBIE, timeout_s=60)
    # Until the fresh engine is up (tens of seconds), the prefill pool is empty: served still, but said.
    assert wait_until(lambda: health()[1]["status"] == "degraded", timeout_s=10, interval_s=0.2), health()
    status, body = health()
    assert status == 200 and "the prefill pool has no serving worker" in body["reasons"], body
    assert complete(graph, FILLERS[2])[1] == 0  # served meanwhile: nothing needs the prefill pool
    assert wait_until(lambda: health()[1]["status"] == "ok", timeout_s=300, interval_s=1.0), graph.logs()[-5000:]
    assert graph.pids()["worker-prefill-0"] != worker_pid
    logs = graph.logs()
    assert "engine_dead" in logs and "exiting for a restart" in logs
