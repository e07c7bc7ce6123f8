"""Routing decisions: which decode worker, and whether (and where) to prefill remotely (docs/architecture.md#a-requests-path, #contracts).

Everything here is a pure function of its arguments except ``Policy``, which only adds the round-robin
counters and the random generator. Overlaps come from the prefix index; loads from the workers' reports.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from common.errors import NoWorkerError
from common.protocol import WorkerLoad
from services.router.defaults import LOCAL_PREFILL_MAX_STALL_S, LOCAL_PREFILL_MAX_TOKENS
from services.router.cost import (CostConfig, Site, choose_pair, choose_prefill, local_prefill_s, predicted_stall_s,
                                  prefill_rate, queued_tokens, typical_rate)
from services.router.index import TierOverlap
from services.router.tier_credit import TierConfig, tier_credit
from services.router.topology import Place, Relation, Topology

# Relative difference from the pool's median prefill rate below which a worker's rate is not priced.
RATE_JITTER = 0.15
PolicyName = Literal["kv", "round-robin", "random", "least-loaded"]
# lowest_cost / sampled: kv policy at temperature 0 / above 0; the others name their policy.
ChoiceReason = Literal["lowest_cost", "sampled", "round_robin", "random", "least_loaded"]
# local_cheaper: the kv policy priced moving the KV (or the prefill queue) above prefilling on the decode worker.
# idle_decode: the kv policy found the decode worker without streams and sooner than the prefill pool.
PrefillReason = Literal["no_prefill_pool", "short_uncached", "prefill_saturated", "remote", "local_cheaper",
                        "idle_decode"]


@dataclass(frozen=True)
class Candidate:
    worker_id: str
    load: WorkerLoad
    # Where it runs (WorkerInfo.node / zone) and its KV bytes per token (0: unknown), for the seconds cost.
    node: str = ""
    zone: str = ""
    kv_bytes_per_token: int = 0
    num_handoffs_due: int = 0  # hand-offs on their way to it (prefilled elsewhere): streams it will have


@dataclass(frozen=True)
class PolicyConfig:
    policy: PolicyName = "kv"
    # Weight of the prefill term (blocks to compute) against the decode term (active KV blocks). Active
    # blocks count every decoding sequence's whole context (shared prefix blocks once per sequence), so one
    # more running request weighs about as much as its prompt: at 1.0 a cached prefix lost to any worker
    # with one request less and kv routing degraded to least-loaded (bench/routing.py: prefix reuse 0.62
    # vs a 0.958 ceiling). 16 keeps each prefix on its worker until that worker carries ~15 requests more
    # (reuse 0.876 at 4, 0.935 at 8, 0.948 at 16, 0.947 at 32; zipf-skewed load likewise peaks at 16).
    prefill_weight: float = 16.0
    # Weight of the prefill already queued on a worker (its waiting prompt tokens: its last load report plus
    # what the router sent it since) against this request's own uncached blocks, when the caller knows the
    # block size. 1: a queued token delays this prompt as much as one of its own; 0: queues unseen, and a hot
    # prefix piled onto one worker (issue 16: zipf TTFT p99 1.15x round-robin's; bench/routing_sim.py: ISL
    # 4,000 p99 up to 1.4 s). Below 1 because a greedy wait-per-request choice thrashes: a replica costs a cold
    # prefill and evicts another prefix, and reported queues count waiting prompts whole, cache hits included
    # (at 1: reuse 0.47-0.72 in the simulation, 0.57 on the uniform workload even with exact queues; 0.1-0.25
    # kept reuse >= 0.89 with every tail under round-robin's, 0.5 let it slip to 0.83).
    queue_weight: float = 0.25
    # Host / disk tier speeds: a block there is credited the seconds its fetch saves against recomputing it
    # on the candidate, in blocks' worth (services/router/tier_credit.py; a device block saves 1).
    tiers: TierConfig = field(default_factory=TierConfig)
    # Fraction of KV blocks in use above which a worker is skipped, unless every worker is above it.
    busy_threshold: float = 0.95
    # 0: always the lowest cost. Above 0: sample softmax(-normalised cost / temperature).
    temperature: float = 0.0
    # Uncached prompt tokens at or below which the decode worker prefills locally...
    local_prefill_max_tokens: int = LOCAL_PREFILL_MAX_TOKENS
    # ...if it has no streams, or the prefill's predicted seconds (uncached tokens / its prefill rate) are at most
    # this; the kv policy's "local cheaper" too. A local prefill stalls every stream on the decode engine for its
    # length (one inter-token gap): 64-token suffixes after cached 1,536-token prefixes broke a 60 ms ITL SLO
    # (peers-shared-prefix.json), 224-token turns after a cached history made 240-300 ms gaps. inf: never priced.
    local_prefill_max_stall_s: float = LOCAL_PREFILL_MAX_STALL_S
    # The prefill pool is saturated when every prefill worker has at least this many requests waiting.
    prefill_queue_limit: int = 8
    # kv policy: local vs remote prefill, and which prefill worker, in predicted seconds (services/router/cost.py).
    cost: CostConfig = field(default_factory=CostConfig)

    def __post_init__(self) -> None:
        if self.policy not in ("kv", "round-robin", "random", "least-loaded"):
            raise ValueError(f"unknown routing policy {self.policy!r}")
        if self.temperature < 0 or self.prefill_weight < 0 or not self.local_prefill_max_stall_s >= 0:
            raise ValueError("temperature, prefill_weight and local_prefill_max_stall_s must be >= 0")


@dataclass(frozen=True)
class Choice:
    worker_id: str
    # The chosen worker's kv cost (computed for every policy, so policies can be compared on it).
    cost: float
    # Credit (blocks' worth of prefill saved) on the chosen worker, and the best credit among the
    # workers the policy could choose from: their gap is the "chosen vs best overlap" metric.
    overlap_blocks: float
    reason: ChoiceReason
    best_overlap_blocks: float = 0.0
    # Every candidate was over the busy threshold, so none was skipped.
    all_busy: bool = False


@dataclass(frozen=True)
class PrefillDecision:
    remote: bool
    reason: PrefillReason


@dataclass(frozen=True)
class RouteChoice:
    decode_worker_id: str
    # None: the decode worker prefills locally.
    prefill_worker_id: str | None
    # Prompt tokens predicted reusable (any tier) on the worker that prefills.
    num_cached_tokens_predicted: int
    reason: PrefillReason
    decode: Choice
    prefill: Choice | None = None
    # kv policy: predicted seconds until the prompt's KV is ready on the decode worker (0: not priced), and
    # the link the KV crosses ("same_node" when prefilled locally).
    predicted_s: float = 0.0
    relation: Relation = "same_node"


def load_key(load: WorkerLoad) -> tuple[int, int]:
    """Lower is less loaded: requests in the engine (running + waiting), then active KV blocks."""
    return (load.num_running + load.num_waiting, load.num_active_blocks)


def is_busy(load: WorkerLoad, threshold: float) -> bool:
    if load.num_total_blocks <= 0:
        return False  # no capacity figure yet: nothing says it is full
    used = load.num_total_blocks - load.num_free_blocks
    return used / load.num_total_blocks > threshold


def kv_cost(
    load: WorkerLoad, overlap: TierOverlap, num_request_blocks: int, config: PolicyConfig, block_size: int = 0,
    kv_bytes_per_token: int = 0,
) -> tuple[float, float]:
    """(cost, credit): cost = prefill_weight * (max(new_blocks - credit, 0) + queue_weight * queued_blocks)
    + active decode blocks; queued blocks = queued prefill tokens / ``block_size`` (0: not priced); credit in
    blocks' worth of prefill seconds saved (``tier_credit``). One worker alone: a pool's choice also scales each
    cost by the worker's prefill rate (``_score``)."""
    credit = _credit(load, kv_bytes_per_token, overlap, block_size, config)
    queue = _queued_blocks(load, config, block_size)
    return config.prefill_weight * (max(num_request_blocks - credit, 0.0) + queue) + load.num_active_blocks, credit


def _credit(load: WorkerLoad, kv_bytes_per_token: int, overlap: TierOverlap, block_size: int,
            config: PolicyConfig) -> float:
    """Blocks' worth of prefill the overlap saves on this worker, at its rate (measured, else the default) and
    its KV bytes per token (registered, else the configured default)."""
    if overlap.disk == overlap.device:  # device blocks only (the common case): no tier to price
        return float(overlap.device)
    return tier_credit(overlap, block_size, kv_bytes_per_token or config.cost.kv_bytes_per_token,
                       prefill_rate(load, config.cost), config.tiers)


def _queued_blocks(load: WorkerLoad, config: PolicyConfig, block_size: int) -> float:
    if block_size <= 0 or config.queue_weight == 0:
        return 0.0
    return config.queue_weight * queued_tokens(load, config.cost) / block_size


def choose_worker(candidates: Sequence[Candidate], overlaps: Mapping[str, TierOverlap], num_request_blocks: int,
                  config: PolicyConfig, rng: random.Random, rr_index: int, block_size: int = 0) -> Choice:
    """One worker from ``candidates`` by ``config.policy``; raises NoWorkerError when there is none.

    Independent of the candidates' order: round-robin, random and sampling index the candidates sorted
    by id; lowest cost breaks ties by ``load_key`` then id.
    """
    if not candidates:
        raise NoWorkerError("no candidate worker")
    threshold = config.busy_threshold
    eligible = [c for c in candidates if not is_busy(c.load, threshold)]
    all_busy = not eligible
    scored = _score(candidates if all_busy else eligible, overlaps, num_request_blocks, config, block_size)
    best_credit = max(credit for _, credit, _ in scored)

    reason: ChoiceReason
    if config.policy == "kv" and config.temperature == 0:
        lowest = min(cost for cost, _, _ in scored)
        ties = [s for s in scored if s[0] == lowest]
        chosen = ties[0] if len(ties) == 1 else min(ties, key=lambda s: (load_key(s[2].load), s[2].worker_id))
        reason = "lowest_cost"
    elif config.policy == "least-loaded":
        chosen = min(scored, key=lambda s: (load_key(s[2].load), s[2].worker_id))
        reason = "least_loaded"
    else:
        scored.sort(key=lambda s: s[2].worker_id)
        match config.policy:
            case "round-robin":
                chosen, reason = scored[rr_index % len(scored)], "round_robin"
            case "random":
                chosen, reason = scored[rng.randrange(len(scored))], "random"
            case _:
                chosen = scored[_sample([cost for cost, _, _ in scored], config.temperature, rng)]
                reason = "sampled"
    cost, credit, candidate = chosen
    return Choice(candidate.worker_id, cost, credit, reason, best_credit, all_busy)


def _score(
    pool: Sequence[Candidate], overlaps: Mapping[str, TierOverlap], num_request_blocks: int, config: PolicyConfig,
    block_size: int = 0,
) -> list[tuple[float, float, Candidate]]:
    """(kv cost, credit, candidate) for each; inlined kv_cost because this runs per worker per route.

    With ``block_size`` the cost is seconds in disguise: each worker's cost is scaled by the pool's typical
    prefill rate over its own (``rate_scales``), so blocks are priced at the speed of the worker that computes them.
    """
    weight = config.prefill_weight
    no_overlap_cost = weight * max(num_request_blocks, 0)  # most workers hold none of the prompt
    scales = rate_scales([c.load for c in pool]) if block_size else None
    out = []
    append = out.append
    get = overlaps.get
    for n, candidate in enumerate(pool):
        load = candidate.load
        queue = weight * _queued_blocks(load, config, block_size) if block_size else 0.0
        overlap = get(candidate.worker_id)
        if overlap is None:
            credit, prefill = 0.0, no_overlap_cost
        else:
            credit = _credit(load, candidate.kv_bytes_per_token, overlap, block_size, config)
            uncached = num_request_blocks - credit
            prefill = weight * uncached if uncached > 0 else 0.0
        cost = prefill + queue + load.num_active_blocks
        append((cost * scales[n] if scales else cost, credit, candidate))
    return out


def rate_scales(loads: Sequence[WorkerLoad]) -> list[float] | None:
    """Per worker: the pool's median measured prefill rate over the worker's own (a worker that measured
    none is taken at the median). None when no worker measured one (every worker alike). Within
    RATE_JITTER of the median a worker counts as typical: a measured rate moves by a few percent with each
    step's decode share, and that noise must not outvote the load tie-break between equal workers."""
    rates = [load.prefill_tokens_per_s for load in loads]
    typical = typical_rate(loads)
    if not typical:
        return None
    scales = [typical / r if 0 < r < math.inf else 1.0 for r in rates]
    return [scale if abs(scale - 1.0) > RATE_JITTER else 1.0 for scale in scales]


def _sample(costs: list[float], temperature: float, rng: random.Random) -> int:
    """Index drawn with weight exp(-(cost / max cost) / temperature): lower cost, likelier."""
    top = max(costs)
    weights = [math.exp(-(c / top if top > 0 else 0.0) / temperature) for c in costs]
    point = rng.random() * sum(weights)
    for index, weight in enumerate(weights):
        point -= weight
        if point < 0:
            return index
    return len(costs) - 1  # float rounding left a sliver


def decide_prefill(
    num_prompt_tokens: int,
    num_cached_tokens_on_decode: int,
    prefill_candidates: Sequence[Candidate],
    config: PolicyConfig,
    local_stall_s: float = 0.0,
) -> PrefillDecision:
    """Local prefill on the decode worker, or remote on the prefill pool (checked in this order).

    ``local_stall_s``: predicted seconds a local prefill would stall the decode worker's streams (0: it has none).
    """
    if not prefill_candidates:
        return PrefillDecision(False, "no_prefill_pool")
    if (num_prompt_tokens - num_cached_tokens_on_decode <= config.local_prefill_max_tokens
            and local_stall_s <= config.local_prefill_max_stall_s):
        return PrefillDecision(False, "short_uncached")
    if all(c.load.num_waiting >= config.prefill_queue_limit for c in prefill_candidates):
        return PrefillDecision(False, "prefill_saturated")
    return PrefillDecision(True, "remote")


class Policy:
    def __init__(self, config: PolicyConfig, seed: int = 0, topology: Topology | None = None) -> None:
        self.config = config
        # Read here, learned by the router service from the workers' transfer samples.
        self.topology = topology if topology is not None else Topology(config.cost.topology)
        self._rng = random.Random(seed)
        # Separate counters: round-robin over decode workers must not skip with the prefill pool's turns.
        self._rr_decode = 0
        self._rr_prefill = 0

    def choose_route(
        self,
        hashes: Sequence[int],
        num_prompt_tokens: int,
        block_size: int,
        decode_candidates: Sequence[Candidate],
        prefill_candidates: Sequence[Candidate],
        overlaps: Mapping[str, TierOverlap],
        held: Mapping[str, TierOverlap] | None = None,
    ) -> RouteChoice:
        """Pick the decode worker, then local vs remote prefill, then (if remote) the prefill worker.

        ``hashes`` are the prompt's full-block hashes (the overlaps were looked up with them); the prompt's
        blocks to compute include a trailing partial block. ``held``: the overlaps without the router's pending
        credit (None: ``overlaps``) decide local vs remote: a prefix routed to a decode worker a moment ago gets
        there only after its remote prefill (prefilled locally on that credit, the next request of the prefix
        computed its whole prompt on the decode engine, a 1.6 s stall). Raises NoWorkerError without decode
        candidates.
        """
        if not decode_candidates:
            raise NoWorkerError("no decode-capable worker")
        config = self.config
        num_blocks = max(-(-num_prompt_tokens // block_size), len(hashes))  # ceil: a partial block is work
        decode = choose_worker(decode_candidates, overlaps, num_blocks, config, self._rng, self._rr_decode, block_size)
        self._rr_decode += 1
        kv = config.policy == "kv"
        if kv and config.temperature == 0:
            decode = self._pair_among_equals(decode, decode_candidates, prefill_candidates, overlaps,
                                             num_prompt_tokens, num_blocks, block_size)
        by_id = {c.worker_id: c for c in (*decode_candidates, *prefill_candidates)}
        # A worker that measured no prefill rate (a decode worker never does) is priced at its peers' rate.
        peer_rate = typical_rate([c.load for c in by_id.values()])
        cached_on_decode = _cached_tokens(overlaps.get(decode.worker_id), block_size, num_prompt_tokens)
        decode_site = _site(by_id[decode.worker_id], overlaps, block_size, config, peer_rate)
        # A "both" worker can be in both pools: prefilling on the decode worker is the local case.
        pool = [c for c in prefill_candidates if c.worker_id != decode.worker_id]
        # Local or not: on what it holds now. Reported (and counted as queued work): with the pending credit.
        held = overlaps if held is None else held
        held_site = decode_site if held is overlaps else _site(by_id[decode.worker_id], held, block_size, config,
                                                                peer_rate)
        decision = decide_prefill(num_prompt_tokens,
                                  _cached_tokens(held.get(decode.worker_id), block_size, num_prompt_tokens), pool,
                                  config, predicted_stall_s(num_prompt_tokens, held_site, config.cost))
        if not decision.remote:
            local_s = local_prefill_s(num_prompt_tokens, decode_site, config.cost) if kv else 0.0
            return RouteChoice(decode.worker_id, None, cached_on_decode, decision.reason, decode, predicted_s=local_s)
        # Not saturated means some prefill worker has queue room: choose among those.
        open_pool = [c for c in pool if c.load.num_waiting < config.prefill_queue_limit]
        if not kv:
            prefill = choose_worker(open_pool, overlaps, num_blocks, config, self._rng, self._rr_prefill)
            self._rr_prefill += 1
            cached = _cached_tokens(overlaps.get(prefill.worker_id), block_size, num_prompt_tokens)
            return RouteChoice(decode.worker_id, prefill.worker_id, cached, decision.reason, decode, prefill)
        sites = [_site(c, overlaps, block_size, config, peer_rate) for c in open_pool]
        priced = choose_prefill(num_prompt_tokens, held_site, sites, self.topology, config.cost,
                                config.local_prefill_max_stall_s)
        if priced.worker_id is None:
            reason: PrefillReason = "idle_decode" if priced.reason == "idle_decode" else "local_cheaper"
            return RouteChoice(decode.worker_id, None, cached_on_decode, reason, decode,
                               predicted_s=priced.predicted_s)
        # The chosen worker's block cost and credit, as the other policies report them (metrics compare on it).
        scored = _score(open_pool, overlaps, num_blocks, config)
        cost, credit, _ = next(s for s in scored if s[2].worker_id == priced.worker_id)
        prefill = Choice(priced.worker_id, cost, credit, "lowest_cost", max(c for _, c, _ in scored))
        cached = _cached_tokens(overlaps.get(prefill.worker_id), block_size, num_prompt_tokens)
        return RouteChoice(decode.worker_id, prefill.worker_id, cached, decision.reason, decode, prefill,
                           predicted_s=priced.predicted_s, relation=priced.relation)

    def _pair_among_equals(self, decode: Choice, decode_candidates: Sequence[Candidate],
                           prefill_candidates: Sequence[Candidate], overlaps: Mapping[str, TierOverlap],
                           num_prompt_tokens: int, num_blocks: int, block_size: int) -> Choice:
        """With workers on several nodes, decode workers of equal kv cost are told apart by their best
        prefill pair in seconds (the closer pair among equal ones). On one node: the kv choice as it was."""
        nodes = {c.node for c in decode_candidates} | {c.node for c in prefill_candidates}
        if len(nodes) < 2 or not prefill_candidates:
            return decode
        config = self.config
        eligible = [c for c in decode_candidates if not is_busy(c.load, config.busy_threshold)] or decode_candidates
        scored = _score(eligible, overlaps, num_blocks, config, block_size)  # priced as choose_worker priced them
        ties = [s for s in scored if s[0] == decode.cost]
        if len(ties) < 2:
            return decode
        peer_rate = typical_rate([c.load for c in (*decode_candidates, *prefill_candidates)])
        open_pool = [_site(c, overlaps, block_size, config, peer_rate) for c in prefill_candidates
                     if c.load.num_waiting < config.prefill_queue_limit]
        decode_sites = [_site(c, overlaps, block_size, config, peer_rate) for _, _, c in ties]
        pair = choose_pair(num_prompt_tokens, decode_sites, open_pool, self.topology, config.cost,
                           config.local_prefill_max_stall_s)
        _, credit, _ = next(s for s in ties if s[2].worker_id == pair.decode_worker_id)
        return Choice(pair.decode_worker_id, decode.cost, credit, decode.reason, decode.best_overlap_blocks,
                      decode.all_busy)


def _site(candidate: Candidate, overlaps: Mapping[str, TierOverlap], block_size: int, config: PolicyConfig,
          peer_rate: float = 0.0) -> Site:
    overlap = overlaps.get(candidate.worker_id)
    credit = 0.0 if overlap is None else _credit(candidate.load, candidate.kv_bytes_per_token, overlap, block_size,
                                                 config)
    return Site(candidate.worker_id, candidate.load, Place(candidate.node, candidate.zone),
                candidate.kv_bytes_per_token, int(credit * block_size), peer_rate, candidate.num_handoffs_due)


def _cached_tokens(overlap: TierOverlap | None, block_size: int, num_prompt_tokens: int) -> int:
    """Prompt tokens reusable from any tier (the engine loads host/disk blocks instead of computing)."""
    if overlap is None:
        return 0
    return min(overlap.disk * block_size, num_prompt_tokens)
