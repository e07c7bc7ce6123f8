"""Workers restarted against a warm kvtier: the `make serve` graph (1 prefill + 1 decode vLLM worker, push, kvtier
on) whose workers are killed and restarted by `up` serves a prompt whose KV only the tier holds, on the decode
worker, and keeps serving. It did not: the tier connector's first load beside NIXL killed vLLM's engine (its
Prometheus logger asserted on the tier's stats), and every later request got a 503.

Every prompt prefills on the decode worker (--local-prefill-max-tokens), so the tier hit is the decode engine's,
under the same MultiConnector (NixlPushConnector + the tier) as `up`'s defaults."""

from __future__ import annotations

import importlib.util
import os
import signal

import httpx
import pytest

from bench.lib.graph import start_graph, wait_until, worker_stats
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


def test_warm_tier_hit_on_the_decode_worker_after_both_workers_restart(tmp_path) -> None:
    graph = start_graph(tmp_path, "--engine", "vllm", "--dtype", "float32", "--local-prefill-max-tokens", "100000",
                        "--host-cache-gb", "0.05")
    try:
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
    finally:
        graph.stop()
