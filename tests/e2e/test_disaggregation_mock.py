"""Disaggregated flow on mock engines: prefill worker -> decode worker, same tokens as aggregated, and
a client that hangs up frees every block."""

from __future__ import annotations

import re
import urllib.request

import httpx

from tests.harness.graph import Graph, wait_until, worker_stats
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


def test_kv_router_prefills_remotely_and_learns_no_link_from_mock_pulls(mock_pd_kv: tuple[Graph, int]) -> None:
    graph, metrics_port = mock_pd_kv
    # Four prompts without a shared prefix: enough pulls (the pair's wire-up plus TopologyConfig's min_samples)
    # that a real engine's would teach the link.
    num_prompts = 1 + TopologyConfig().min_samples
    for i in range(num_prompts):
        client(graph).completions.create(model=MODEL, prompt=[5000 + 700 * i + j for j in range(700)], max_tokens=4)
    stats = worker_stats(graph.router)
    (decode_id,) = [wid for wid, s in stats.items() if s.num_transfers]
    (prefill_id,) = [wid for wid in stats if wid != decode_id]
    # The decode worker's pulls name the prefill worker they came from, and say they were simulated ...
    assert [(t.num_bytes, t.src_worker_id, t.simulated) for t in stats[decode_id].recent_transfers] == [
        (700 * MOCK_KV_BYTES_PER_TOKEN, prefill_id, True)] * num_prompts
    assert stats[decode_id].transfers_simulated

    def router_metric(name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
            text = resp.read().decode()
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    # ... and reach the router with heartbeats, which counts them apart and learns no link from them (no byte
    # crossed a wire): the route is priced by the configured same-node link.
    assert wait_until(lambda: router_metric('splitserve_router_simulated_samples_total{kind="transfer"}')
                      == num_prompts)
    assert router_metric("splitserve_router_transfer_samples_total") == 0
    assert router_metric("splitserve_router_link_bandwidth_bytes_per_second") == 0  # no series: nothing learned
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
