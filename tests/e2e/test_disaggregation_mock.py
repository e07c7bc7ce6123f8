"""Disaggregated flow on mock engines: prefill worker -> decode worker, same tokens as aggregated, and
a client that hangs up frees every block."""

from __future__ import annotations

import re
import urllib.request

import httpx
import pytest

from bench.lib.graph import Graph, wait_until, worker_stats
from common.timing import TimingModel
from services.router.topology import TopologyConfig
from tests.e2e.test_openai_api import MODEL, client

MOCK_KV_BYTES_PER_TOKEN = 36864  # MockEngineConfig's default
LONG_PROMPT = list(range(100, 100 + 700))  # 700 tokens: above the local-prefill threshold (256)


def metric(graph: Graph, name: str) -> float:
    with urllib.request.urlopen(graph.url + "/metrics") as resp:
        text = resp.read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_disaggregated_equals_aggregated(mock_pd: Graph, mock_agg: Graph) -> None:
    for prompt, seed in [(LONG_PROMPT, 1), (LONG_PROMPT[:300], 2), ([7, 8, 9], 3), (LONG_PROMPT[:513], 4)]:
        pd = client(mock_pd).completions.create(model=MODEL, prompt=prompt, max_tokens=24, seed=seed)
        agg = client(mock_agg).completions.create(model=MODEL, prompt=prompt, max_tokens=24, seed=seed)
        assert pd.choices[0].text == agg.choices[0].text
        assert pd.usage.completion_tokens == agg.usage.completion_tokens == 24


def test_long_prompt_prefills_remotely_short_locally(mock_pd: Graph) -> None:
    remote_before = metric(mock_pd, 'splitserve_frontend_prefill_decisions_total{where="remote"}')
    local_before = metric(mock_pd, 'splitserve_frontend_prefill_decisions_total{where="local"}')
    transfers_before = sum(s.num_transfers for s in worker_stats(mock_pd.router).values())
    client(mock_pd).completions.create(model=MODEL, prompt=[3000 + i for i in range(600)], max_tokens=4)
    client(mock_pd).completions.create(model=MODEL, prompt=[11, 12, 13], max_tokens=4)
    assert metric(mock_pd, 'splitserve_frontend_prefill_decisions_total{where="remote"}') == remote_before + 1
    assert metric(mock_pd, 'splitserve_frontend_prefill_decisions_total{where="local"}') == local_before + 1
    assert sum(s.num_transfers for s in worker_stats(mock_pd.router).values()) == transfers_before + 1


def test_kv_router_prefills_remotely_and_learns_the_link(mock_pd_kv: tuple[Graph, int]) -> None:
    graph, metrics_port = mock_pd_kv
    # Four prompts without a shared prefix: the pair's first pull (its wire-up) is not learned from, the three
    # after it are the link's min_samples (TopologyConfig's default).
    num_prompts = 1 + TopologyConfig().min_samples
    for i in range(num_prompts):
        client(graph).completions.create(model=MODEL, prompt=[5000 + 700 * i + j for j in range(700)], max_tokens=4)
    stats = worker_stats(graph.router)
    (decode_id,) = [wid for wid, s in stats.items() if s.num_transfers]
    (prefill_id,) = [wid for wid in stats if wid != decode_id]
    # The decode worker's pulls name the prefill worker they came from ...
    assert [(t.num_bytes, t.src_worker_id) for t in stats[decode_id].recent_transfers] == [
        (700 * MOCK_KV_BYTES_PER_TOKEN, prefill_id)] * num_prompts

    def router_metric(name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
            text = resp.read().decode()
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    # ... and reach the router with heartbeats, which learn the link's bandwidth from them: the mock's
    # modelled pull time at --mock-speedup 10, less the router's same-node latency (capped at half the pull).
    num_bytes = 700 * MOCK_KV_BYTES_PER_TOKEN
    pull_s = TimingModel(speedup=10).transfer_s(num_bytes)
    moving_s = max(pull_s - TopologyConfig().same_node_latency_s, pull_s / 2)
    assert wait_until(lambda: router_metric('splitserve_router_transfer_samples_total{used="yes"}') == num_prompts - 1)
    assert router_metric('splitserve_router_transfer_samples_total{used="no"}') == 1  # the wire-up pull
    assert router_metric("splitserve_router_link_bandwidth_bytes_per_second") == pytest.approx(num_bytes / moving_s)
    remote = 'splitserve_router_predicted_prefill_seconds_count{relation="same_node",where="remote"}'
    assert router_metric(remote) == num_prompts


def test_client_disconnect_frees_every_block(mock_pd: Graph) -> None:
    initial = {wid: s.load.num_free_blocks for wid, s in worker_stats(mock_pd.router).items()}
    body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 3000, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", mock_pd.url + "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            lines = 0
            for line in resp.iter_lines():
                lines += line.startswith("data: ")
                if lines >= 20:
                    # Read stats before leaving the loop: leaving it closes the response (the hang-up).
                    busy = {wid: s.load.num_free_blocks for wid, s in worker_stats(mock_pd.router).items()}
                    break
            assert any(busy[w] < initial[w] for w in initial), "the request should hold blocks mid-stream"
    assert wait_until(lambda: {w: s.load.num_free_blocks for w, s in worker_stats(mock_pd.router).items()} == initial,
                      timeout_s=1.0)  # the requirement: every block back within a second
    assert metric(mock_pd, "splitserve_frontend_cancelled_requests_total") >= 1
