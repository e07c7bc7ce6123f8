"""Where to prefill, in predicted seconds (docs/architecture.md#a-requests-path).

Remote prefill on worker P for decode worker D costs
    P's queued prefill tokens / P's rate + P's uncached prompt tokens / P's rate + move(KV bytes, link P -> D)
and local prefill on D costs
    (D's queued prefill tokens + D's uncached prompt tokens) / D's rate
        * (local_prefill_factor + decode_interference_per_stream * D's running streams)
because a decode worker that prefills stalls its decode streams for the chunk's length (their inter-token
latency pays, not this request's TTFT): the factor is that price, in seconds of this prefill.

The cheapest remote worker is chosen on the whole sum (among near-equal ones, the closest). It goes local
when its prompt's own work there (compute + move) costs more than computing the prompt on the decode worker
(``queue_aware_local``: the queues count too).

Rates are what the worker measured (``WorkerLoad.prefill_tokens_per_s``), else what its peers measured (the
median of the candidates that report one: the same model on the same engine), else the configured default (seeded
from a profile). A decode worker in a P/D graph prefills one token a request and so never measures a rate: priced
at the default while its peers measure theirs, a default faster than they turned out to be made every prompt "local
cheaper" and stalled its decode streams for whole prefills until a local one had measured it. KV bytes per token come from the worker's registration. Pure functions of their arguments:
the topology is only read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from common.protocol import WorkerLoad
from common.timing import TimingModel
from services.router.topology import RELATION_RANK, Link, Place, Relation, Topology, TopologyConfig

# remote: the cheapest remote pair (ties -> the closest); local_cheaper: computing the prompt remotely and
# moving its KV (with queue_aware_local: and the queues) costs more than computing it on the decode worker;
# idle_decode: the decode worker has no streams and computes the prompt sooner than the remote worker would
# through its queue (``idle_decode_prefills``); no_remote: no prefill worker to price.
CostReason = Literal["remote", "local_cheaper", "idle_decode", "no_remote"]
# Prompt length at which a profile's prefill rate is read: a typical chunk, past the per-step overhead.
PROFILE_RATE_TOKENS = 1024


@dataclass(frozen=True)
class CostConfig:
    # Prefill tokens/s of a worker that reports no measured rate (TimingModel's default is ~2,000 at 1k tokens).
    prefill_tokens_per_s: float = 2000.0
    # KV bytes per prompt token when no worker registered one; 0: unknown, a move costs its latency only.
    kv_bytes_per_token: int = 0
    # Queued prompt tokens per waiting request, for engines that count requests but not tokens (vLLM).
    waiting_request_tokens: int = 1024
    # Local prefill seconds are multiplied by this plus decode_interference_per_stream per running stream:
    # at 1.5 an idle single-host pair still prefills remotely (the move is ~2% of the prefill there).
    local_prefill_factor: float = 1.5
    decode_interference_per_stream: float = 0.02
    # Predicted times within this fraction of the best are equal: the closer pair (same node, then same
    # zone) wins among them.
    equal_tolerance: float = 0.05
    # True: queues count in local vs remote too, so a long prefill queue sends a prompt back to its decode
    # worker. False (default): local vs remote weighs the prompt's own work only (moving its KV against
    # computing it on the decode worker), and queues only pick among prefill workers; a full prefill pool
    # still goes local at PolicyConfig.prefill_queue_limit, as before (one host keeps today's choices).
    queue_aware_local: bool = False
    # True: a decode worker with no streams (none running, waiting or due) is one more prefill engine while the
    # prefill pool is busy. Nothing there to stall, so its prefill is priced at its queue and compute alone (no
    # local_prefill_factor) against the remote worker's queue and compute, and goes local when done sooner by
    # more than equal_tolerance. The move is left out: it would make every idle pair prefill locally to save
    # this prompt a transfer, while the decode worker's next arrivals waited out the prefill; with a queue at
    # the prefill pool they would have waited there too, and the pool's queue is one prompt shorter (long-mix:
    # a 2,048-token prompt waited out another on the one CPU prefill engine, docs/measuring.md).
    idle_decode_prefills: bool = True
    topology: TopologyConfig = field(default_factory=TopologyConfig)

    def __post_init__(self) -> None:
        if not self.prefill_tokens_per_s > 0:
            raise ValueError("prefill_tokens_per_s must be positive")
        if self.local_prefill_factor <= 0 or self.decode_interference_per_stream < 0 or self.equal_tolerance < 0:
            raise ValueError("local_prefill_factor must be > 0; interference and tolerance >= 0")

    @classmethod
    def from_timing(cls, timing: TimingModel, **overrides: object) -> CostConfig:
        """Defaults seeded from a profile: its prefill rate, and its transfer figures as the same-node link."""
        rate = PROFILE_RATE_TOKENS / timing.prefill_s(PROFILE_RATE_TOKENS)
        topology = overrides.pop("topology", None) or TopologyConfig(
            same_node_bytes_per_s=timing.transfer_bandwidth_bytes_per_s,
            same_node_latency_s=timing.transfer_latency_s)
        return cls(**{"prefill_tokens_per_s": rate, "topology": topology, **overrides})  # type: ignore[arg-type]


@dataclass(frozen=True)
class Site:
    """A worker as the cost sees it for one request."""

    worker_id: str
    load: WorkerLoad
    place: Place = Place("")
    kv_bytes_per_token: int = 0
    # Prompt tokens this worker need not compute (tier-weighted prefix credit * block size).
    num_cached_tokens: int = 0
    # Tokens/s its peers measured (``typical_rate``; 0: none did), assumed while it measured none of its own.
    peer_tokens_per_s: float = 0.0
    # Hand-offs on their way to it (prefilled elsewhere, not in its reports yet): streams it is about to have.
    num_handoffs_due: int = 0


@dataclass(frozen=True)
class PrefillChoice:
    # None: the decode worker prefills.
    worker_id: str | None
    predicted_s: float
    reason: CostReason
    # The local alternative's prediction (equal to predicted_s when local was chosen).
    local_s: float
    # Link from the chosen prefill worker to the decode worker ("same_node" for local).
    relation: Relation = "same_node"
    transfer_s: float = 0.0


def _measured(rate: float) -> bool:
    return 0 < rate < float("inf")


def prefill_rate(load: WorkerLoad, config: CostConfig, peer_tokens_per_s: float = 0.0) -> float:
    """The worker's measured prefill tokens/s, else its peers' (``peer_tokens_per_s``), else the default."""
    for rate in (load.prefill_tokens_per_s, peer_tokens_per_s):
        if _measured(rate):
            return rate
    return config.prefill_tokens_per_s


def typical_rate(loads: Sequence[WorkerLoad]) -> float:
    """The median prefill rate among the workers that measured one; 0 when none did."""
    measured = sorted(load.prefill_tokens_per_s for load in loads if _measured(load.prefill_tokens_per_s))
    if not measured:
        return 0.0
    mid = len(measured) // 2
    return measured[mid] if len(measured) % 2 else (measured[mid - 1] + measured[mid]) / 2


def queued_tokens(load: WorkerLoad, config: CostConfig) -> int:
    if load.num_waiting_tokens >= 0:
        return load.num_waiting_tokens
    return load.num_waiting * config.waiting_request_tokens


def local_prefill_s(num_prompt_tokens: int, decode: Site, config: CostConfig, with_queue: bool = True) -> float:
    uncached = max(num_prompt_tokens - decode.num_cached_tokens, 0)
    queued = queued_tokens(decode.load, config) if with_queue else 0
    compute_s = (queued + uncached) / prefill_rate(decode.load, config, decode.peer_tokens_per_s)
    return compute_s * (config.local_prefill_factor + config.decode_interference_per_stream * decode.load.num_running)


def own_work_s(num_prompt_tokens: int, site: Site, config: CostConfig) -> float:
    """Seconds of prefill on ``site`` before this prompt's KV is there: its queue, then the uncached tokens."""
    uncached = max(num_prompt_tokens - site.num_cached_tokens, 0)
    return (queued_tokens(site.load, config) + uncached) / prefill_rate(site.load, config, site.peer_tokens_per_s)


def streaming(decode: Site) -> bool:
    """Whether ``decode`` has streams a prefill there would stall: running, waiting (routed-since-report requests
    count, as ``effective_load`` adds them as waiting) or hand-offs still due."""
    return decode.load.num_running + decode.load.num_waiting + decode.num_handoffs_due > 0


def predicted_stall_s(num_prompt_tokens: int, decode: Site, config: CostConfig) -> float:
    """Seconds a local prefill of the uncached tokens would stall the streams on ``decode`` (0 without streams)."""
    if not streaming(decode):
        return 0.0
    uncached = max(num_prompt_tokens - decode.num_cached_tokens, 0)
    return uncached / prefill_rate(decode.load, config, decode.peer_tokens_per_s)


class RemoteCost(NamedTuple):
    queue_s: float  # the prefill worker's queued prompt tokens at its rate
    compute_s: float  # this prompt's uncached tokens there
    transfer_s: float  # the KV move to the decode worker
    link: Link

    @property
    def total_s(self) -> float:
        return self.queue_s + self.compute_s + self.transfer_s


def remote_prefill(num_prompt_tokens: int, prefill: Site, decode: Site, topology: Topology,
                   config: CostConfig) -> RemoteCost:
    """Prefill on ``prefill`` for ``decode``, in seconds. The decode worker pulls only what it lacks."""
    rate = prefill_rate(prefill.load, config, prefill.peer_tokens_per_s)
    uncached = max(num_prompt_tokens - prefill.num_cached_tokens, 0)
    bytes_per_token = prefill.kv_bytes_per_token or decode.kv_bytes_per_token or config.kv_bytes_per_token
    num_bytes = max(num_prompt_tokens - decode.num_cached_tokens, 0) * bytes_per_token
    link = topology.link(prefill.place, decode.place)
    # Unknown KV size: the move is priced at its latency alone (a bandwidth cannot be applied to no bytes).
    transfer_s = link.transfer_s(num_bytes) if num_bytes else link.latency_s
    return RemoteCost(queued_tokens(prefill.load, config) / rate, uncached / rate, transfer_s, link)


def choose_prefill(num_prompt_tokens: int, decode: Site, prefill_sites: Sequence[Site], topology: Topology,
                   config: CostConfig, max_stall_s: float = float("inf")) -> PrefillChoice:
    """The cheapest remote prefill worker for ``decode`` (among near-equal ones the closest, then the
    fastest, then the least loaded, then by id), unless prefilling on ``decode`` itself is cheaper and stalls
    its streams for at most ``max_stall_s`` (``predicted_stall_s``): cheaper in seconds of this prompt, a
    224-token turn behind a cached history was prefilled on a streaming CPU decode engine, a 240-300 ms gap in
    every stream there (multi-turn; shared prefixes and the tier workload likewise)."""
    local_s = local_prefill_s(num_prompt_tokens, decode, config)
    if not prefill_sites:
        return PrefillChoice(None, local_s, "no_remote", local_s)
    priced = [(remote_prefill(num_prompt_tokens, site, decode, topology, config), site) for site in prefill_sites]
    best_s = min(cost.total_s for cost, _ in priced)
    near = [p for p in priced if p[0].total_s <= best_s * (1 + config.equal_tolerance)]
    cost, site = min(near, key=lambda p: (RELATION_RANK[p[0].link.relation], p[0].total_s, _load_key(p[1].load),
                                          p[1].worker_id))
    if config.queue_aware_local:
        go_local = local_s < cost.total_s
    else:  # the prompt's own work on each side: moving its KV against computing it where it will decode
        own_local_s = local_prefill_s(num_prompt_tokens, decode, config, with_queue=False)
        go_local = own_local_s < cost.compute_s + cost.transfer_s
    if go_local and predicted_stall_s(num_prompt_tokens, decode, config) <= max_stall_s:
        return PrefillChoice(None, local_s, "local_cheaper", local_s)
    if config.idle_decode_prefills and not streaming(decode):
        idle_s = own_work_s(num_prompt_tokens, decode, config)
        if idle_s < (cost.queue_s + cost.compute_s) * (1 - config.equal_tolerance):
            return PrefillChoice(None, idle_s, "idle_decode", idle_s)
    return PrefillChoice(site.worker_id, cost.total_s, "remote", local_s, cost.link.relation, cost.transfer_s)


@dataclass(frozen=True)
class PairChoice:
    decode_worker_id: str
    prefill: PrefillChoice


def choose_pair(num_prompt_tokens: int, decode_sites: Sequence[Site], prefill_sites: Sequence[Site],
                topology: Topology, config: CostConfig, max_stall_s: float = float("inf")) -> PairChoice:
    """Among decode workers the kv policy found equal, the one whose best prefill is fastest; near-equal
    pairs go to the closest (local prefill counts as same node), then the faster, then the less loaded.

    Priced per place, not per worker, so a route stays cheap in a large cluster: of the prefill workers at
    one place only the one with the least own work can win (they share every link), and of the decode workers
    at one place the least loaded stands for them (as the kv policy's tie-break would pick it).
    """
    if not decode_sites:
        raise ValueError("choose_pair needs a decode site")
    decode_reps = _best_per_place(decode_sites, lambda s: (_load_key(s.load), s.worker_id))
    # Queue + compute: all that differs between the prefill workers at one place.
    prefill_reps = _best_per_place(prefill_sites, lambda s: (own_work_s(num_prompt_tokens, s, config),
                                                             _load_key(s.load), s.worker_id))
    pairs = []
    for decode in decode_reps:
        pool = [s for s in prefill_reps if s.worker_id != decode.worker_id]
        pairs.append((choose_prefill(num_prompt_tokens, decode, pool, topology, config, max_stall_s), decode))
    best_s = min(choice.predicted_s for choice, _ in pairs)
    near = [p for p in pairs if p[0].predicted_s <= best_s * (1 + config.equal_tolerance)]
    choice, decode = min(near, key=lambda p: (RELATION_RANK[p[0].relation], p[0].predicted_s,
                                              _load_key(p[1].load), p[1].worker_id))
    return PairChoice(decode.worker_id, choice)


def _best_per_place(sites: Sequence[Site], key: Callable[[Site], Any]) -> list[Site]:
    best: dict[Place, Site] = {}
    for site in sites:
        held = best.get(site.place)
        if held is None or key(site) < key(held):
            best[site.place] = site
    return list(best.values())


def _load_key(load: WorkerLoad) -> tuple[int, int]:
    return (load.num_running + load.num_waiting, load.num_active_blocks)


def handoff_due_s(now_s: float, predicted_remote_s: float) -> float:
    """When a hand-off routed now is given up on, if no KV event said it arrived: twice the predicted remote
    prefill and transfer plus 2 s for the queueing a prediction misses (a late one only keeps local prefills off
    that worker a while longer: later first tokens, never a stalled stream), at most 30 s."""
    return now_s + min(2.0 * predicted_remote_s + 2.0, 30.0)
