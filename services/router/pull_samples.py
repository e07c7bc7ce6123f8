"""A decode worker's reported KV pulls teach the router the bandwidth of the links they crossed; any worker's
reported KV tier loads teach it the tiers' speeds (``TierSpeeds``), which the kv policy's tier credit uses."""

from __future__ import annotations

import dataclasses
import time

from common.protocol import TierLoadSample, TransferSample
from services.router.metrics import RouterMetrics
from services.router.policy import Policy
from services.router.registry import Registry
from services.router.tier_speeds import TierSpeeds
from services.router.topology import Place, Topology


def learn_links(registry: Registry, topology: Topology, metrics: RouterMetrics, worker_id: str,
                samples: tuple[TransferSample, ...]) -> None:
    """Feed a decode worker's pulls to the link from each source's node to its own. A source the registry does
    not know (unattributed, or gone since) teaches nothing. ``used="yes"``: the sample entered the link's window
    (learned or not yet); ``"no"``: unknown source, a pair's wire-up pull, or too small to time bandwidth."""
    dst = registry.get(worker_id)
    assert dst is not None  # the heartbeat was just recorded
    for sample in samples:
        src = registry.get(sample.src_worker_id) if sample.src_worker_id else None
        if src is None:
            metrics.transfer_samples.labels(used="no").inc()
            continue
        src_place, dst_place = Place(src.info.node, src.info.zone), Place(dst.info.node, dst.info.zone)
        recorded = topology.record(src_place, dst_place, sample.num_bytes, sample.seconds, time.monotonic(),
                                   pair=(src.info.worker_id, worker_id))
        metrics.transfer_samples.labels(used="yes" if recorded.use in ("learned", "pending") else "no").inc()
        if recorded.use == "learned" and recorded.bytes_per_s is not None:
            metrics.link_bandwidth.labels(src_node=src.info.node, dst_node=dst.info.node).set(recorded.bytes_per_s)


def learn_tiers(speeds: TierSpeeds, policy: Policy, metrics: RouterMetrics,
                samples: tuple[TierLoadSample, ...]) -> None:
    """Feed a worker's tier loads to the learner; a changed fit becomes the policy's tier speeds."""
    for sample in samples:
        metrics.tier_samples.labels(tier=sample.tier).inc()
    if speeds.record(samples):
        policy.config = dataclasses.replace(policy.config, tiers=speeds.config)
        show_tiers(speeds, metrics)


def show_tiers(speeds: TierSpeeds, metrics: RouterMetrics) -> None:
    for tier, fit in (("host", speeds.host), ("disk", speeds.disk)):
        metrics.tier_bandwidth.labels(tier=tier).set(fit.link.bytes_per_s)
        metrics.tier_latency.labels(tier=tier).set(fit.link.latency_s)
