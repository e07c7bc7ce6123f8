"""KV-aware routing on a real graph: workers publish KV events, the router sends a prefix where it lives."""

from __future__ import annotations

import time

from tests.e2e.test_openai_api import MODEL, client
from bench.lib.graph import Graph


def test_repeated_prefix_hits_the_worker_that_cached_it(mock_kv2: Graph) -> None:
    c = client(mock_kv2)
    cached = []
    for prefix_id in range(3):
        prefix = [1000 + 700 * prefix_id + i for i in range(640)]  # 40 full blocks
        for turn in range(4):
            out = c.completions.create(model=MODEL, prompt=prefix + [50 + turn, 60 + turn], max_tokens=2)
            cached.append((prefix_id, turn, out.usage.prompt_tokens_details.cached_tokens))
            time.sleep(0.05)  # events are published every 10 ms
    for prefix_id, turn, num_cached in cached:
        if turn == 0:
            assert num_cached == 0, cached
        else:
            assert num_cached == 640, cached
