"""Tier loads on heartbeats: they survive the wire (and older peers), and the router prices tier blocks with
the speeds it learns from them."""

from __future__ import annotations

import re

import msgspec
from prometheus_client import generate_latest

from common.protocol import (
    PROTOCOL_VERSION,
    Heartbeat,
    RegisterAck,
    RegisterWorker,
    TierLoadSample,
    WorkerInfo,
    WorkerLoad,
    decode,
    encode,
)
from services.router.service import RouterConfig, RouterService
from services.router.tier_credit import TierConfig

MB = 1 << 20
LOADS = tuple(TierLoadSample(seq=i, tier="host", num_bytes=b, seconds=0.002 + b / 2e8)
              for i, b in enumerate([MB, 2 * MB, 4 * MB], 1))


class OldHeartbeat(msgspec.Struct, frozen=True, tag="Heartbeat", omit_defaults=True):
    """A Heartbeat as a worker from before tier loads sends and reads it."""

    worker_id: str
    load: WorkerLoad
    seq: int = 0


def test_heartbeat_round_trip_and_older_peers() -> None:
    beat = Heartbeat(worker_id="w", load=WorkerLoad(), seq=3, tier_loads=LOADS)
    assert decode(encode(beat)) == beat
    # An older router ignores the new field; an older worker's beat decodes with no tier loads.
    old = msgspec.msgpack.decode(encode(beat), type=OldHeartbeat)
    assert old.worker_id == "w" and old.seq == 3
    got = decode(msgspec.msgpack.encode(OldHeartbeat(worker_id="w", load=WorkerLoad(), seq=3)))
    assert isinstance(got, Heartbeat) and got.tier_loads == ()


def _gauge(svc: RouterService, tier: str) -> float:
    text = generate_latest(svc.metrics.registry).decode()
    match = re.search(rf'splitserve_router_tier_bytes_per_second{{tier="{tier}"}} (\S+)', text)
    assert match is not None
    return float(match.group(1))


def test_router_learns_tier_speeds_from_heartbeats() -> None:
    svc = RouterService(RouterConfig(pending_ttl_s=0.0))
    svc.events_endpoint = "tcp://127.0.0.1:9"
    info = WorkerInfo(worker_id="w", role="both", model="m", block_size=16, num_blocks=100,
                      endpoint="tcp://127.0.0.1:19")
    assert isinstance(svc.handle(b"w", RegisterWorker(request_id="r", info=info,
                                                      protocol_version=PROTOCOL_VERSION)), RegisterAck)
    seed = TierConfig()
    assert svc.policy.config.tiers == seed
    assert _gauge(svc, "host") == seed.host_bytes_per_s and _gauge(svc, "disk") == seed.disk_bytes_per_s
    assert svc.handle(b"w", Heartbeat(worker_id="w", load=WorkerLoad(), seq=1, tier_loads=LOADS)) is None
    tiers = svc.policy.config.tiers
    assert abs(tiers.host_bytes_per_s - 2e8) < 1e3 and abs(tiers.host_latency_s - 0.002) < 1e-9
    assert tiers.disk == seed.disk
    assert abs(_gauge(svc, "host") - 2e8) < 1e3 and _gauge(svc, "disk") == seed.disk_bytes_per_s
