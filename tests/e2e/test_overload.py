"""A guarded frontend: an API key is required on /v1/*, and past its in-flight cap it answers 503 with
Retry-After at once, then recovers."""

from __future__ import annotations

import httpx
import openai

from tests.harness.graph import Graph, start_graph, wait_until
from tests.e2e.test_openai_api import MODEL


def test_api_key_and_load_shedding(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPLITSERVE_MAX_INFLIGHT", "2")
    monkeypatch.setenv("SPLITSERVE_API_KEY", "s3cret")
    graph: Graph = start_graph(tmp_path, "--engine", "mock", "--aggregated", "1", "--mock-speedup", "10",
                               "--no-kvtier")
    try:
        with httpx.Client(timeout=30) as http:
            for headers in ({}, {"authorization": "Bearer wrong"}):
                denied = http.post(graph.url + "/v1/completions", headers=headers,
                                   json={"model": MODEL, "prompt": "x", "max_tokens": 1})
                assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
            assert http.get(graph.url + "/health").status_code == 200  # probes need no key
        body = {"model": MODEL, "prompt": "hold the line", "max_tokens": 2000, "stream": True, "ignore_eos": True}
        with httpx.Client(timeout=30, headers={"authorization": "Bearer s3cret"}) as http:
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
        keyed = openai.OpenAI(base_url=graph.url + "/v1", api_key="s3cret", max_retries=0, timeout=30)
        assert wait_until(lambda: keyed.completions.create(
            model=MODEL, prompt="x", max_tokens=1).usage.completion_tokens == 1, timeout_s=5)
    finally:
        graph.stop()
