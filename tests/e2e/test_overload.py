"""Overload: past its in-flight cap the frontend answers 503 with Retry-After at once, and recovers."""

from __future__ import annotations

import httpx

from tests.e2e.test_openai_api import MODEL, client
from tests.graph import Graph, start_graph, wait_until


def test_saturated_frontend_sheds_load_with_retry_after(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPLITSERVE_MAX_INFLIGHT", "2")
    graph: Graph = start_graph(tmp_path, "--engine", "mock", "--aggregated", "1", "--mock-speedup", "10",
                               "--no-kvtier")
    try:
        body = {"model": MODEL, "prompt": "hold the line", "max_tokens": 2000, "stream": True, "ignore_eos": True}
        with httpx.Client(timeout=30) as http:
            with http.stream("POST", graph.url + "/v1/completions", json=body) as a, \
                    http.stream("POST", graph.url + "/v1/completions", json=body) as b:
                assert a.status_code == b.status_code == 200
                # Keep the line iterators: a dropped one closes its response (a client hang-up).
                lines_a, lines_b = a.iter_lines(), b.iter_lines()
                assert next(lines_a) and next(lines_b)
                shed = http.post(graph.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
                assert shed.status_code == 503
                assert shed.headers["retry-after"] == "1"
                assert shed.json()["error"]["code"] == "overloaded"
        # Both streams were cut by the client: capacity comes back.
        assert wait_until(lambda: client(graph).completions.create(
            model=MODEL, prompt="x", max_tokens=1).usage.completion_tokens == 1, timeout_s=5)
    finally:
        graph.stop()
