"""The router names another host's kvtier for a decode worker when its run is longer and moving beats computing."""

from __future__ import annotations

import pytest

from common.protocol import BlockStored, RegisterTier, WorkerInfo, WorkerLoad
from services.router.cost import CostConfig
from services.router.index import PrefixIndex
from services.router.remote_tier import remote_tier
from services.router.topology import Place, Topology

BS = 32
REQ = [11, 12, 13, 14, 15, 16, 17, 18, 19]  # 9 full blocks; a prompt of 9 * 32 + 1 tokens may load all 9
TIERS = {"t-b": RegisterTier(request_id="r", tier_id="t-b", endpoint="tcp://b:5570", node="b"),
         "t-d": RegisterTier(request_id="r", tier_id="t-d", endpoint="tcp://d:5570", node="d")}
WORKER = WorkerInfo(worker_id="w-d", role="both", model="m", block_size=BS, num_blocks=64, endpoint="tcp://d:1",
                    node="d", kv_bytes_per_token=4096)  # 128 KiB a block


def index_with(runs: dict[str, int]) -> PrefixIndex:
    index = PrefixIndex(shared_source_ids=TIERS)
    for tier_id, n in runs.items():
        if n:
            index.apply(tier_id, BlockStored(block_hashes=tuple(REQ[:n]), parent_hash=None, tier="host"))
    return index


@pytest.mark.parametrize(("runs", "want", "extra"), [
    ({"t-b": 0, "t-d": 0}, None, 0),
    ({"t-b": 8, "t-d": 8}, None, 0),  # the own host's tier holds as much
    ({"t-b": 8, "t-d": 3}, "t-b", 5),  # the rest of the run from B
    ({"t-b": 9, "t-d": 0}, "t-b", 9),
    ({"t-b": 2, "t-d": 5}, None, 0),  # B holds less than the own tier
])
def test_remote_tier_named_past_the_own_hosts_run(runs, want, extra) -> None:
    pick = remote_tier(WORKER, WorkerLoad(), TIERS, index_with(runs), Topology(), CostConfig(), REQ,
                       len(REQ) * BS + 1, BS)
    assert (pick.tier.tier_id if pick.tier else None, pick.num_extra_blocks) == (want, extra)


def test_a_slow_learned_link_means_recompute() -> None:
    topology = Topology()
    # 1 MiB pulls in 1 s from B to D: 1 MiB/s, far slower than computing at 2,000 tokens/s.
    for _ in range(3):
        topology.record(Place("b"), Place("d"), 1 << 20, 1.0)
    pick = remote_tier(WORKER, WorkerLoad(), TIERS, index_with({"t-b": 8}), topology, CostConfig(), REQ,
                       len(REQ) * BS + 1, BS)
    assert (pick.tier, pick.reason) == (None, "recompute_cheaper")


def test_source_run_counts_leading_blocks_in_any_tier() -> None:
    index = index_with({"t-b": 3})
    index.apply("t-b", BlockStored(block_hashes=(REQ[3],), parent_hash=REQ[2], tier="disk"))
    index.apply("t-b", BlockStored(block_hashes=(REQ[5],), parent_hash=REQ[4], tier="host"))  # after a gap
    assert index.source_run("t-b", REQ) == 4
    assert index.source_run("t-d", REQ) == 0 and index.source_run("t-b", []) == 0


def test_a_tier_registered_at_loopback_is_never_named_to_another_node() -> None:
    # kvtier-b bound 127.0.0.1 beside its worker on B: C's decode worker would dial its own loopback.
    tiers = {**TIERS, "t-b": RegisterTier(request_id="r", tier_id="t-b", endpoint="tcp://127.0.0.1:5570", node="b")}
    pick = remote_tier(WORKER, WorkerLoad(), tiers, index_with({"t-b": 9, "t-d": 0}), Topology(), CostConfig(), REQ,
                       len(REQ) * BS + 1, BS)
    assert (pick.tier, pick.reason) == (None, "no_longer_run")
    # Its own node's workers still count it as their own tier (nothing remote is needed past its run).
    own = WorkerInfo(worker_id="w-b", role="both", model="m", block_size=BS, num_blocks=64, endpoint="tcp://b:1",
                     node="b", kv_bytes_per_token=4096)
    pick = remote_tier(own, WorkerLoad(), tiers, index_with({"t-b": 9, "t-d": 9}), Topology(), CostConfig(), REQ,
                       len(REQ) * BS + 1, BS)
    assert pick.tier is None and pick.reason == "no_longer_run"
