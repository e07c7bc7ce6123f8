"""The router's side of kvtier: registration, its host/disk events credited to every worker, liveness."""

from __future__ import annotations

import time

from common.protocol import (
    PROTOCOL_VERSION,
    BlockStored,
    ErrorReply,
    Heartbeat,
    KvEvents,
    KvSnapshot,
    RegisterAck,
    RegisterTier,
    RegisterWorker,
    WorkerInfo,
    WorkerLoad,
)
from services.router.index import TierOverlap
from services.router.service import RouterConfig, RouterService


def _router() -> RouterService:
    svc = RouterService(RouterConfig(heartbeat_timeout_s=2.0))
    svc.events_endpoint = "tcp://127.0.0.1:9"
    for wid in ("w0", "w1"):
        info = WorkerInfo(worker_id=wid, role="both", model="m", block_size=16, num_blocks=64,
                          endpoint=f"tcp://127.0.0.1:1{wid[-1]}", kv_events=True)
        assert isinstance(svc.handle(wid.encode(), RegisterWorker(request_id=wid, info=info,
                                                                     protocol_version=PROTOCOL_VERSION)), RegisterAck)
        _snapshot(svc, wid)
    return svc


def _snapshot(svc: RouterService, source_id: str) -> None:
    """The source's answer to the snapshot the router asks for on registration: nothing held, nothing published."""
    assert svc.handle(source_id.encode(), KvSnapshot(request_id="s", worker_id=source_id, event_id=-1,
                                                     tier_blocks=())) is None


def _tier_events(event_id: int, *events) -> KvEvents:
    return KvEvents(worker_id="kvtier-0", event_id=event_id, events=events)


def test_tier_blocks_count_for_every_worker() -> None:
    svc = _router()
    hashes = [11, 12, 13, 14]
    svc._apply_events(KvEvents(worker_id="w0", event_id=0,
                               events=(BlockStored(block_hashes=(11,), parent_hash=None, tier="device"),)))
    # Before registration, a tier's events are dropped.
    svc._apply_events(_tier_events(0, BlockStored(block_hashes=(11, 12, 13), parent_hash=None, tier="host")))
    assert svc._overlaps(hashes) == {"w0": TierOverlap(1, 1, 1)}
    ack = svc.handle(b"kvtier-0", RegisterTier(request_id="r", tier_id="kvtier-0", endpoint="tcp://127.0.0.1:5",
                                           protocol_version=PROTOCOL_VERSION))
    assert ack == RegisterAck(request_id="r", worker_id="kvtier-0", events_endpoint="tcp://127.0.0.1:9")
    _snapshot(svc, "kvtier-0")
    svc._apply_events(_tier_events(0, BlockStored(block_hashes=(11, 12, 13), parent_hash=None, tier="host")))
    svc._apply_events(_tier_events(1, BlockStored(block_hashes=(14,), parent_hash=None, tier="disk")))
    assert svc._overlaps(hashes) == {"w0": TierOverlap(1, 3, 4), "w1": TierOverlap(0, 3, 4)}


def test_tier_heartbeat_and_expiry() -> None:
    svc = _router()
    svc.handle(b"kvtier-0", RegisterTier(request_id="r", tier_id="kvtier-0", endpoint="tcp://127.0.0.1:5",
                                           protocol_version=PROTOCOL_VERSION))
    _snapshot(svc, "kvtier-0")
    svc._apply_events(_tier_events(0, BlockStored(block_hashes=(21, 22), parent_hash=None, tier="host")))
    assert svc.handle(b"kvtier-0", Heartbeat(worker_id="kvtier-0", load=WorkerLoad())) is None
    assert isinstance(svc.handle(b"x", Heartbeat(worker_id="nobody", load=WorkerLoad())), ErrorReply)
    assert svc._expire_tiers(time.monotonic()) == []
    assert svc._expire_tiers(time.monotonic() + 10) == ["kvtier-0"]
    assert svc._overlaps([21, 22]) == {}
    # A dead tier's late events are dropped; after it re-registers (numbering from 0) they count again.
    svc._apply_events(_tier_events(1, BlockStored(block_hashes=(21,), parent_hash=None, tier="host")))
    assert svc._overlaps([21, 22]) == {}
    svc.handle(b"kvtier-0", RegisterTier(request_id="r2", tier_id="kvtier-0", endpoint="tcp://127.0.0.1:5",
                                           protocol_version=PROTOCOL_VERSION))
    _snapshot(svc, "kvtier-0")
    svc._apply_events(_tier_events(0, BlockStored(block_hashes=(21,), parent_hash=None, tier="host")))
    assert svc._overlaps([21, 22]) == {"w0": TierOverlap(0, 1, 1), "w1": TierOverlap(0, 1, 1)}
