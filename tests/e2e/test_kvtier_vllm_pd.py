"""kvtier on a prefill/decode vLLM graph: both workers run NixlConnector and our kvtier connector inside vLLM's
MultiConnector. Every prompt prefills on the prefill worker (--local-prefill-max-tokens 0). A prefix evicted from
the engines comes back from kvtier into the prefill worker's KV cache, the decode worker pulls it from there over
NIXL, and the output equals the first, fresh one (fp32, greedy, the tiny model)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.e2e.test_kvtier_mock import _settled, _tier_up, tier_stats
from tests.e2e.test_kvtier_vllm import FILLERS, PREFIX, complete
from bench.lib.graph import start_graph, wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]


def test_prefix_onboarded_under_multiconnector(tmp_path) -> None:
    graph = start_graph(tmp_path, "--engine", "vllm", "--dtype", "float32", "--prefill", "1", "--decode", "1",
                        "--num-blocks", "25", "--local-prefill-max-tokens", "0", "--host-cache-gb", "0.05")
    try:
        assert wait_until(lambda: _tier_up(graph), timeout_s=20), graph.logs()[-3000:]
        reference, _ = complete(graph, PREFIX)  # prefilled remotely, KV pulled by the decode worker over NIXL
        for filler in FILLERS[:2]:  # evict P from both engines (each filler fills one)
            complete(graph, filler)
        _settled(graph)
        before = tier_stats(graph)
        assert before.blocks_stored >= 8 + 2 * 23
        text, _ = complete(graph, PREFIX)
        assert text == reference
        after = tier_stats(graph)
        assert after.hits_host - before.hits_host == 8 and after.checksum_failures == 0
        logs = graph.logs()
        assert "MultiConnector" in logs
        assert [line for line in logs.splitlines() if "kvtier_loaded" in line and "worker_id=prefill-0" in line]
    finally:
        graph.stop()
