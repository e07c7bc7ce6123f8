"""Push through the HTTP API: `up --kv-transfer push`, a vLLM prefill worker WRITEs each long prompt's KV into
the decode worker's blocks (vLLM NixlPushConnector), against one vLLM engine doing both. fp32, greedy: outputs
must match token for token. The frontend gives the prefill and the decode request one id: that id is what the
prefill engine matches the decode engine's block registration by. The prefill worker reports each WRITE with the
decode worker it went into, and the router learns the prefill -> decode link from them as it does from pulls."""

from __future__ import annotations

import importlib.util
import re
import statistics
import urllib.request

import pytest

from tests.harness.graph import start_graph, wait_until, worker_stats
from cli.launcher import free_port
from services.router.topology import TopologyConfig
from tests.e2e.test_disaggregation_mock import metric
from tests.e2e.reference import VLLM_ARGS, Reference, complete, prompt

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]
LENGTHS = (65, 129, 257, 1500)  # all above --local-prefill-max-tokens 64: every one prefills remotely


def test_pushed_kv_through_http_equals_aggregated(tmp_path, vllm_reference: Reference) -> None:
    metrics_port = free_port()
    pd = start_graph(tmp_path, *VLLM_ARGS, "--prefill", "1", "--decode", "1", "--kv-transfer", "push",
                     "--router-metrics-port", str(metrics_port))

    def router_metrics() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
            return resp.read().decode()

    try:
        got = {n: complete(pd, prompt(n, salt=n)) for n in LENGTHS}
        remote = metric(pd, 'splitserve_frontend_prefill_decisions_total{where="remote"}')
        failures = metric(pd, "splitserve_frontend_kv_transfer_failures_total")
        # The prefill worker's WRITEs, in vLLM's NIXL telemetry, reach the router with its next heartbeat.
        assert wait_until(lambda: worker_stats(pd.router)["prefill-0"].num_transfers == len(LENGTHS), timeout_s=10)
        assert wait_until(lambda: 'splitserve_router_transfer_samples_total{used="yes"} 3.0' in router_metrics(),
                          timeout_s=10), router_metrics()
        stats = worker_stats(pd.router)
        text = router_metrics()
    finally:
        pd.stop()
    assert remote == len(LENGTHS) and not failures
    prefill, decode = stats["prefill-0"], stats["decode-1"]
    # One WRITE per prompt, of every block of it (fp32 tiny model: 128 KiB per 32-token block); no READ.
    assert prefill.num_transfer_failures == 0
    assert prefill.num_transfer_bytes == sum(-(-n // 32) for n in LENGTHS) * 32 * 2 * 4 * 2 * 64 * 4
    assert decode.num_transfers == 0
    # Each WRITE names where it went (the decode engine's id is its worker id) and came from.
    writes = prefill.recent_transfers
    assert [(t.src_worker_id, t.dst_worker_id) for t in writes] == [("prefill-0", "decode-1")] * len(LENGTHS)
    # The router learned the prefill -> decode link (one node here) from exactly those WRITEs but the pair's first
    # (it timed NIXL's wire-up): the median of each one's bytes over its seconds less the same-node latency
    # (services/router/topology.py), no default.
    assert 'splitserve_router_transfer_samples_total{used="no"} 1.0' in text
    gauge = re.findall(r'^splitserve_router_link_bandwidth_bytes_per_second\{dst_node="([^"]*)",src_node="([^"]*)"\} '
                       r'(\S+)$', text, re.M)
    latency_s = TopologyConfig().same_node_latency_s
    learned = statistics.median(t.num_bytes / max(t.seconds - latency_s, t.seconds / 2) for t in writes[1:])
    assert len(gauge) == 1 and gauge[0][0] == gauge[0][1] and float(gauge[0][2]) == pytest.approx(learned, rel=1e-6)
    # One engine doing both (computed by tests/e2e/test_vllm_disagg.py's engine when that ran first).
    for n, out in zip(LENGTHS, vllm_reference.outputs([prompt(n, salt=n) for n in LENGTHS]), strict=True):
        assert out == got[n], f"prompt of {n} tokens"
