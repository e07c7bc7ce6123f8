"""Links between nodes as the router prices them: bandwidth (bytes/s) and a fixed latency per KV move.

A link starts at its relation's default (same node, same zone, other zone) and, once workers report transfers
over it (``Heartbeat.transfers``: decode workers their pulls, prefill workers their pushes), becomes the median of
its recent samples. Learned per ordered (src_node, dst_node) pair, in the direction KV moves: prefill -> decode.
A worker without a node label is on node "" and one without a zone on zone "": one host and one zone, so a deployment that labels nothing keeps today's single-host prices.

One slow transfer must not price a link: a link learned slow is not used, so not measured again until its samples
expire (``sample_ttl_s``), and meanwhile every prompt over it prefills on its decode worker. Two guards:
- the first transfer of each (prefill worker, decode worker) pair is not learned from (``num_warmup_pulls``):
  it also times the pair's one-time wire-up (UCX connects lazily, on the first READ or WRITE), a cost later pulls do not
  pay: between two vLLM engines on one host, 393 KB took 8.4 ms on the first pull, 0.5-6 MB 0.17-0.56 ms after.
  At a fleet's start every pair's first pull is such a sample, so a median alone could be made of them.
- a link is learned only once ``min_samples`` samples are in its window; until then its default prices it. With
  the median, one outlier among them (a pull that waited for a busy CPU) moves nothing.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import Literal, NamedTuple

Relation = Literal["same_node", "same_zone", "cross_zone"]
# What one pull taught: learned (in the window, the link is learned), pending (in the window, fewer than
# min_samples there), warmup (a pair's wire-up pull), ignored (too small or untimed: says nothing of bandwidth).
SampleUse = Literal["learned", "pending", "warmup", "ignored"]
# Locality rank of a relation: lower is closer (the tie-break among equally fast pairs).
RELATION_RANK: dict[Relation, int] = {"same_node": 0, "same_zone": 1, "cross_zone": 2}


class Place(NamedTuple):
    node: str
    zone: str = ""


@dataclass(frozen=True)
class TopologyConfig:
    # Defaults until a link is measured. Same node: NIXL's scattered READ within one host (the mock's
    # TimingModel figure); same zone: a 100 Gbit/s RDMA network; other zone: 10 Gbit/s. They err fast on
    # purpose: a link priced too slow is never used, so it is never measured either.
    same_node_bytes_per_s: float = 3.4e9
    same_zone_bytes_per_s: float = 1.25e10
    cross_zone_bytes_per_s: float = 1.25e9
    # Fixed seconds per move (handshake, notification, first byte), added to bytes / bandwidth.
    same_node_latency_s: float = 0.0005
    same_zone_latency_s: float = 0.001
    cross_zone_latency_s: float = 0.005
    # Samples per link in the median: enough to ride out an outlier, few enough to follow a change in seconds.
    window: int = 32
    # Samples a link needs in its window before they price it (the default does until then): the median of 3
    # ignores one slow pull; 1 trusts any single one.
    min_samples: int = 3
    # Pulls of each (prefill worker, decode worker) pair not learned from: its first also times NIXL's wire-up.
    num_warmup_pulls: int = 1
    # Smaller pulls time the latency, not the bandwidth: not learned from.
    min_sample_bytes: int = 64 * 1024
    # A link with no sample for this long goes back to its default: one learned slow is otherwise never used
    # again, so never measured again, even after it recovered.
    sample_ttl_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("same_node_bytes_per_s", "same_zone_bytes_per_s", "cross_zone_bytes_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        for name in ("same_node_latency_s", "same_zone_latency_s", "cross_zone_latency_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.window < 1 or not self.sample_ttl_s > 0:
            raise ValueError("window must be >= 1 and sample_ttl_s > 0")
        if not 1 <= self.min_samples <= self.window or self.num_warmup_pulls < 0:
            raise ValueError("min_samples must be in 1..window and num_warmup_pulls >= 0")

    def bytes_per_s(self, relation: Relation) -> float:
        match relation:
            case "same_node":
                return self.same_node_bytes_per_s
            case "same_zone":
                return self.same_zone_bytes_per_s
            case _:
                return self.cross_zone_bytes_per_s

    def latency_s(self, relation: Relation) -> float:
        match relation:
            case "same_node":
                return self.same_node_latency_s
            case "same_zone":
                return self.same_zone_latency_s
            case _:
                return self.cross_zone_latency_s


@dataclass(frozen=True)
class Link:
    relation: Relation
    bytes_per_s: float
    latency_s: float
    # Measured (median of samples) rather than the relation's default.
    learned: bool = False

    def transfer_s(self, num_bytes: int) -> float:
        """Seconds to move ``num_bytes`` of KV over this link (0 bytes: nothing moves, no latency)."""
        if num_bytes <= 0:
            return 0.0
        return self.latency_s + num_bytes / self.bytes_per_s


class Recorded(NamedTuple):
    use: SampleUse
    # The link's bandwidth after this sample; None while it is not learned.
    bytes_per_s: float | None


def relation(src: Place, dst: Place) -> Relation:
    if src.node == dst.node:
        return "same_node"
    return "same_zone" if src.zone == dst.zone else "cross_zone"


class Topology:
    """Default links plus the ones learned from samples. ``link`` only reads: decisions stay pure."""

    def __init__(self, config: TopologyConfig | None = None) -> None:
        self.config = config or TopologyConfig()
        self._samples: dict[tuple[str, str], deque[float]] = {}
        self._learned: dict[tuple[str, str], float] = {}
        self._last_sample_s: dict[tuple[str, str], float] = {}
        # (src_worker_id, dst_worker_id) -> pulls seen, counted up to num_warmup_pulls.
        self._pair_pulls: dict[tuple[str, str], int] = {}

    def record(self, src: Place, dst: Place, num_bytes: int, seconds: float, now_s: float = 0.0,
               pair: tuple[str, str] | None = None) -> Recorded:
        """Learn from one finished transfer (pull or push) from ``src`` to ``dst``; ``pair``: the (prefill,
        decode) worker ids that made it, whose first ``num_warmup_pulls`` transfers teach nothing (None: not
        known, no warm-up)."""
        key = (src.node, dst.node)
        if pair is not None and self._pair_pulls.get(pair, 0) < self.config.num_warmup_pulls:
            # Counted whatever its size: a small first pull paid the wire-up as well.
            self._pair_pulls[pair] = self._pair_pulls.get(pair, 0) + 1
            return Recorded("warmup", self._learned.get(key))
        if num_bytes < self.config.min_sample_bytes or not seconds > 0:
            return Recorded("ignored", self._learned.get(key))
        latency_s = self.config.latency_s(relation(src, dst))
        # The move's own time is seconds minus the fixed part; half the sample at least, so a latency set
        # too high cannot turn a real pull into an infinite bandwidth.
        moving_s = max(seconds - latency_s, seconds / 2)
        window = self._samples.get(key)
        if window is None:
            window = self._samples[key] = deque(maxlen=self.config.window)
        window.append(num_bytes / moving_s)
        self._last_sample_s[key] = now_s
        if len(window) < self.config.min_samples:
            return Recorded("pending", None)
        self._learned[key] = statistics.median(window)
        return Recorded("learned", self._learned[key])

    def expire(self, now_s: float) -> list[tuple[str, str]]:
        """Forget links whose last sample is older than ``sample_ttl_s``; returns their (src, dst) nodes
        (learned or still pending)."""
        stale = [key for key, seen_s in self._last_sample_s.items() if now_s - seen_s > self.config.sample_ttl_s]
        for key in stale:
            del self._samples[key], self._last_sample_s[key]
            self._learned.pop(key, None)  # a link with fewer than min_samples was never learned
        return stale

    def forget_worker(self, worker_id: str) -> None:
        """A worker left or registered again (a new engine): its pairs' next pulls wire up anew."""
        for pair in [p for p in self._pair_pulls if worker_id in p]:
            del self._pair_pulls[pair]

    def link(self, src: Place, dst: Place) -> Link:
        rel = relation(src, dst)
        learned = self._learned.get((src.node, dst.node))
        if learned is not None:
            return Link(rel, learned, self.config.latency_s(rel), learned=True)
        return Link(rel, self.config.bytes_per_s(rel), self.config.latency_s(rel))

    def learned_links(self) -> dict[tuple[str, str], float]:
        """(src_node, dst_node) -> bytes/s, for every measured link."""
        return dict(self._learned)
