"""The KV transfers workers report teach the router the bandwidth of the links they crossed; any worker's reported
KV tier loads teach it the tiers' speeds (``TierSpeeds``), which the kv policy's tier credit uses.

A transfer is reported by its NIXL initiator: a pull by the decode worker that READ (source named in the sample,
destination the reporter), a push by the prefill worker that WROTE (destination named, source the reporter). Both
are one transfer's bytes over its post-to-completion seconds in the direction KV moves, prefill -> decode, so
both feed the same (src_node, dst_node) link.

Samples a mock engine made up (``simulated``: bytes from its KV geometry, seconds from its timing model) teach
neither a link nor a tier: they are counted apart (``splitserve_router_simulated_samples``) and dropped.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol, TypeVar

from common.protocol import TierLoadSample, TransferSample
from services.router.metrics import RouterMetrics
from services.router.policy import Policy
from services.router.registry import Registry, WorkerEntry
from services.router.tier_speeds import TierSpeeds
from services.router.topology import Place, Topology


class _Sample(Protocol):
    @property
    def simulated(self) -> bool: ...


S = TypeVar("S", bound=_Sample)


def samples_that_teach(samples: tuple[S, ...]) -> tuple[tuple[S, ...], int]:
    """The samples the router may learn a link or tier speed from (order kept), and how many it dropped as
    simulated: a mock engine's made-up move says nothing about any wire or tier."""
    real = tuple(s for s in samples if not s.simulated)
    return real, len(samples) - len(real)


def link_ends(registry: Registry, worker_id: str, sample: TransferSample) -> tuple[WorkerEntry, WorkerEntry] | None:
    """The (source, destination) workers of a sample ``worker_id`` reported; None when either is unknown
    (unattributed, or gone since): such a sample teaches nothing."""
    if sample.dst_worker_id:  # a push: the reporter wrote into dst
        src_id, dst_id = sample.src_worker_id or worker_id, sample.dst_worker_id
    else:  # a pull: the reporter read from src
        src_id, dst_id = sample.src_worker_id, worker_id
    src = registry.get(src_id) if src_id else None
    dst = registry.get(dst_id) if dst_id else None
    if src is None or dst is None or src is dst:
        return None
    return src, dst


def learn_links(registry: Registry, topology: Topology, metrics: RouterMetrics, worker_id: str,
                samples: tuple[TransferSample, ...]) -> None:
    """Feed a worker's transfers (its pulls or its pushes) to the link from each source's node to its
    destination's. ``used="yes"``: the sample entered the link's window (learned or not yet); ``"no"``: unknown
    end, a pair's wire-up transfer, or too small to time bandwidth. Simulated samples: counted apart, nothing more."""
    samples, num_simulated = samples_that_teach(samples)
    if num_simulated:
        metrics.simulated_samples.labels(kind="transfer").inc(num_simulated)
    for sample in samples:
        ends = link_ends(registry, worker_id, sample)
        if ends is None:
            metrics.transfer_samples.labels(used="no").inc()
            continue
        src, dst = ends
        src_place, dst_place = Place(src.info.node, src.info.zone), Place(dst.info.node, dst.info.zone)
        recorded = topology.record(src_place, dst_place, sample.num_bytes, sample.seconds, time.monotonic(),
                                   pair=(src.info.worker_id, dst.info.worker_id))
        metrics.transfer_samples.labels(used="yes" if recorded.use in ("learned", "pending") else "no").inc()
        if recorded.use == "learned" and recorded.bytes_per_s is not None:
            metrics.link_bandwidth.labels(src_node=src.info.node, dst_node=dst.info.node).set(recorded.bytes_per_s)


def learn_tiers(speeds: TierSpeeds, policy: Policy, metrics: RouterMetrics,
                samples: tuple[TierLoadSample, ...]) -> None:
    """Feed a worker's tier loads to the learner; a changed fit becomes the policy's tier speeds. Simulated
    loads: counted apart, nothing more."""
    samples, num_simulated = samples_that_teach(samples)
    if num_simulated:
        metrics.simulated_samples.labels(kind="tier_load").inc(num_simulated)
    for sample in samples:
        metrics.tier_samples.labels(tier=sample.tier).inc()
    if speeds.record(samples):
        policy.config = dataclasses.replace(policy.config, tiers=speeds.config)
        show_tiers(speeds, metrics)


def show_tiers(speeds: TierSpeeds, metrics: RouterMetrics) -> None:
    for tier, fit in (("host", speeds.host), ("disk", speeds.disk)):
        metrics.tier_bandwidth.labels(tier=tier).set(fit.link.bytes_per_s)
        metrics.tier_latency.labels(tier=tier).set(fit.link.latency_s)
