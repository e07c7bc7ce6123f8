"""bench/routing_sim.py: the offline replay of the routing benchmark runs the real scheduler and policy."""

from __future__ import annotations

from bench.routing_sim import SimConfig, simulate, workload
from services.router.policy import PolicyConfig


def test_kv_reuses_prefixes_round_robin_does_not() -> None:
    cfg = SimConfig(num_workers=4, num_prefixes=8, prefix_tokens=640, num_requests=160, concurrency=8,
                    num_blocks=48, zipf_s=1.1)
    prompts = workload(cfg)
    kv = simulate(cfg, PolicyConfig(), prompts)
    rr = simulate(cfg, PolicyConfig(policy="round-robin"), prompts)
    assert sum(kv.per_worker_requests.values()) == sum(rr.per_worker_requests.values()) == 160
    assert max(rr.per_worker_requests.values()) - min(rr.per_worker_requests.values()) <= 1
    assert kv.reuse > rr.reuse + 0.2
    assert kv.ttft_ms["p50"] < rr.ttft_ms["p50"]
