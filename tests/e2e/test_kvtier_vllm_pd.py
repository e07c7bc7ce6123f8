"""kvtier on a prefill/decode vLLM graph: both workers run NixlConnector and our kvtier connector inside vLLM's
MultiConnector. A prefix evicted from the engines comes back from kvtier (on whichever worker the router picks
to prefill it) and the output equals the first, fresh one (fp32, greedy, the tiny model)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.e2e.test_kvtier_mock import _settled, _tier_up, tier_stats
from tests.e2e.test_kvtier_vllm import FILLERS, PREFIX, complete
from tests.graph import start_graph, wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]


def test_prefix_onboarded_under_multiconnector(tmp_path) -> None:
    graph = start_graph(tmp_path, "--engine", "vllm", "--dtype", "float32", "--prefill", "1", "--decode", "1",
                        "--num-blocks", "25", "--local-prefill-max-tokens", "64", "--host-cache-gb", "0.05")
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
        assert "MultiConnector" in graph.logs()
    finally:
        graph.stop()
