"""KV-aware routing on a real graph: workers publish KV events, the router sends a prefix where it lives."""

from __future__ import annotations

import re
import urllib.request

from tests.harness.graph import Graph, wait_until
from tests.e2e.test_openai_api import MODEL, client


def _router_metric(graph: Graph, name: str) -> float:
    port = re.search(r"--router-metrics-port (\d+)", " ".join(graph.proc.args)).group(1)  # type: ignore[union-attr]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_repeated_prefix_hits_the_worker_that_cached_it(mock_kv2: Graph) -> None:
    c = client(mock_kv2)
    cached = []
    for prefix_id in range(3):
        prefix = [1000 + 700 * prefix_id + i for i in range(640)]  # 40 full blocks
        for turn in range(4):
            applied = _router_metric(mock_kv2, "splitserve_router_kv_events_applied_total")
            out = c.completions.create(model=MODEL, prompt=prefix + [50 + turn, 60 + turn], max_tokens=2)
            cached.append((prefix_id, turn, out.usage.prompt_tokens_details.cached_tokens))
            if turn == 0:  # the new prefix's blocks are stored: wait until the router has applied that event
                assert wait_until(lambda: _router_metric(mock_kv2, "splitserve_router_kv_events_applied_total")
                                  > applied, timeout_s=10)
    for prefix_id, turn, num_cached in cached:
        if turn == 0:
            assert num_cached == 0, cached
        else:
            assert num_cached == 640, cached
