"""The kv policy's route with workers on several nodes: prefill placement and pairing in seconds.

Figures as in test_cost.py: rate 1,000 tokens/s, local factor 1.5; a 2,000-token prompt (125 blocks of 16)
with 10,000 KV bytes/token is 2e7 bytes: same zone 0.2 + 0.002 s, other zone 2.0 + 0.01 s.
"""

from __future__ import annotations

import pytest

from common.protocol import WorkerLoad
from services.router.cost import CostConfig
from services.router.policy import Candidate, Policy, PolicyConfig, RouteChoice
from services.router.topology import Place, TopologyConfig

BS = 16
PROMPT = 2000
HASHES = list(range(1000, 1000 + PROMPT // BS))
TOPOLOGY = TopologyConfig(same_node_bytes_per_s=1e9, same_zone_bytes_per_s=1e8, cross_zone_bytes_per_s=1e7,
                          same_node_latency_s=0.001, same_zone_latency_s=0.002, cross_zone_latency_s=0.01,
                          min_sample_bytes=1000, min_samples=1)  # one sample teaches a link
KV = PolicyConfig(cost=CostConfig(prefill_tokens_per_s=1000.0, local_prefill_factor=1.5,
                                  decode_interference_per_stream=0.0, topology=TOPOLOGY))


def cand(worker_id: str, node: str = "", zone: str = "", kv: int = 10_000, waiting: int = 0,
         queued: int = 0) -> Candidate:
    load = WorkerLoad(num_waiting=waiting, num_free_blocks=1000, num_total_blocks=1000, num_waiting_tokens=queued)
    return Candidate(worker_id, load, node=node, zone=zone, kv_bytes_per_token=kv)


def route(policy: Policy, decode: list[Candidate], prefill: list[Candidate]) -> RouteChoice:
    return policy.choose_route(HASHES, PROMPT, BS, decode, prefill, {})


def summary(choice: RouteChoice) -> tuple:
    return (choice.decode_worker_id, choice.prefill_worker_id, choice.reason,
            round(choice.predicted_s, 6), choice.relation)


@pytest.mark.parametrize(
    ("decode", "prefill", "expected"),
    [
        pytest.param([cand("d", "a", "z1")], [cand("p", "c", "z2")],
                     ("d", None, "local_cheaper", 3.0, "same_node"), id="cross-zone-slow-link-local"),
        pytest.param([cand("d", "a", "z1")], [cand("p", "b", "z1")],
                     ("d", "p", "remote", 2.202, "same_zone"), id="same-zone-remote"),
        # Two decode workers of equal kv cost: the one on the prefill worker's node (by id, "da" would win).
        pytest.param([cand("da", "a", "z1"), cand("db", "b", "z1")], [cand("p", "b", "z1")],
                     ("db", "p", "remote", 2.021, "same_node"), id="pair-same-node"),
        # Same with prefill queued on both decode workers (equal kv cost, queues priced): still paired.
        pytest.param([cand("da", "a", "z1", queued=320), cand("db", "b", "z1", queued=320)], [cand("p", "b", "z1")],
                     ("db", "p", "remote", 2.021, "same_node"), id="pair-same-node-queued"),
        # Same, unlabelled (one host): the kv choice as before, by id.
        pytest.param([cand("da"), cand("db")], [cand("p")],
                     ("da", "p", "remote", 2.021, "same_node"), id="one-host-unchanged"),
        # No prefill pool: local, still priced (for the metric).
        pytest.param([cand("d", "a", "z1")], [], ("d", None, "no_prefill_pool", 3.0, "same_node"), id="no-pool"),
    ],
)
def test_route_in_seconds(decode: list[Candidate], prefill: list[Candidate], expected: tuple) -> None:
    assert summary(route(Policy(KV), decode, prefill)) == expected


def test_learned_link_changes_the_route() -> None:
    policy = Policy(KV)
    decode, prefill = [cand("d", "a", "z1")], [cand("p", "c", "z2")]
    assert route(policy, decode, prefill).prefill_worker_id is None
    # The router learned the c -> a link at 1e9 bytes/s (2e7 bytes in 0.02 s + 0.01 s latency).
    policy.topology.record(Place("c", "z2"), Place("a", "z1"), 20_000_000, 0.03)
    assert summary(route(policy, decode, prefill)) == ("d", "p", "remote", 2.03, "cross_zone")


def test_other_policies_ignore_topology() -> None:
    choice = route(Policy(PolicyConfig(policy="round-robin", cost=KV.cost)), [cand("d", "a", "z1")],
                   [cand("p", "c", "z2")])
    assert (choice.prefill_worker_id, choice.reason, choice.predicted_s) == ("p", "remote", 0.0)


def test_prefill_choice_keeps_its_block_cost() -> None:
    # The remote prefill Choice still reports the kv block cost and credit (metrics compare policies on it).
    choice = route(Policy(KV), [cand("d", "a", "z1")], [cand("p", "b", "z1")])
    assert choice.prefill is not None
    assert (choice.prefill.worker_id, choice.prefill.cost, choice.prefill.overlap_blocks) == ("p", 16.0 * 125, 0.0)
