"""The router's half of "own host's kvtier first, another host's if cheaper than recomputing": which other-host
tier, if any, a decode worker that prefills locally should load the prompt's next blocks from.

Glue only: the runs come from the index (each tier's leading blocks of the prompt), the links from the
topology (learned, else the relation's default), the prefill rate from the worker's load; the decision is
``common.kvtier.sources.pick_remote_tier``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from common.addresses import reachable_off_host
from common.kvtier.sources import Link as TierLink
from common.kvtier.sources import RemoteTierPick, TierRun, pick_remote_tier
from common.protocol import RegisterTier, WorkerInfo, WorkerLoad
from services.router.cost import CostConfig, prefill_rate
from services.router.index import PrefixIndex
from services.router.topology import Place, Topology


def remote_tier(worker: WorkerInfo, load: WorkerLoad, tiers: Mapping[str, RegisterTier], index: PrefixIndex,
                topology: Topology, cost: CostConfig, hashes: Sequence[int], num_prompt_tokens: int,
                block_size: int) -> RemoteTierPick:
    # A tier registered at a loopback address serves its own node only: a worker elsewhere would dial itself.
    runs = [TierRun(tier_id, info.endpoint, info.node, index.source_run(tier_id, hashes))
            for tier_id, info in tiers.items() if info.node == worker.node or reachable_off_host(info.endpoint)]
    zones = {info.node: info.zone for info in tiers.values()}
    dst = Place(worker.node, worker.zone)

    def link_to(node: str) -> TierLink:
        link = topology.link(Place(node, zones.get(node, "")), dst)
        return TierLink(link.bytes_per_s, link.latency_s)

    block_bytes = worker.kv_bytes_per_token * block_size or max((t.block_bytes for t in tiers.values()), default=0)
    num_loadable = max(0, num_prompt_tokens - 1) // block_size
    return pick_remote_tier(worker.node, runs, num_loadable, block_size, block_bytes, prefill_rate(load, cost),
                            link_to)
