"""The router applies authorize: a peer lying about who it is changes nothing, is counted, and the router goes on
serving; once in process (RouterService.handle) and once through real CURVE sockets."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path

import zmq

from common import protocol
from common.protocol import (
    PROTOCOL_VERSION,
    BlockStored,
    ErrorReply,
    Heartbeat,
    KvEvents,
    KvSnapshot,
    ListWorkers,
    RegisterAck,
    RegisterWorker,
    SetRole,
    Unregister,
    WorkerInfo,
    WorkerList,
    WorkerLoad,
)
from common.security import SecureContext, load_curve_keys, make_curve_keys, secure_client
from common.transport import Client, TransportConfig, new_id
from services.router.service import RouterConfig, RouterService

INFO = WorkerInfo(worker_id="w0", role="both", model="m", block_size=4, num_blocks=8, endpoint="tcp://127.0.0.1:9",
                  kv_events=True)


def _refused(svc: RouterService, kind: str) -> float:
    return svc.metrics.registry.get_sample_value("splitserve_router_messages_refused_total", {"message": kind}) or 0.0


def _registered_router() -> RouterService:
    svc = RouterService(RouterConfig())
    svc.events_endpoint = "tcp://127.0.0.1:9"
    svc.gate.kinds = {"K-worker": "worker", "K-frontend": "frontend", "K-planner": "planner"}
    ack = svc.handle(b"c-w0", RegisterWorker(request_id="r", info=INFO, protocol_version=PROTOCOL_VERSION), "K-worker")
    assert isinstance(ack, RegisterAck)
    return svc


def test_the_frontend_key_lying_about_a_worker_changes_nothing() -> None:
    svc = _registered_router()
    # The frontend's valid key, even on the worker's own routing id (a DEALER may choose its identity).
    for identity in (b"c-fe", b"c-w0"):
        assert svc.handle(identity, Unregister(worker_id="w0"), "K-frontend") is None
        assert svc.handle(identity, Heartbeat(worker_id="w0", load=WorkerLoad(), draining=True), "K-frontend") is None
        assert svc.handle(identity, KvSnapshot(request_id="s", worker_id="w0", event_id=-1, tier_blocks=()),
                          "K-frontend") is None
        assert svc.handle(identity, SetRole(request_id="x", worker_id="w0", role="decode"), "K-frontend") is None
    entry = svc.registry.get("w0")
    assert entry is not None and not entry.draining
    assert svc.index.tracker.awaiting_snapshot("w0")  # the fake snapshot was not loaded
    assert _refused(svc, "Unregister") == 2 and _refused(svc, "Heartbeat") == 2 and _refused(svc, "SetRole") == 2
    # Another worker (the shared worker key) on another connection cannot unregister it either.
    assert svc.handle(b"c-w1", Unregister(worker_id="w0"), "K-worker") is None
    assert svc.registry.get("w0") is not None
    # w0 itself can.
    svc.handle(b"c-w0", Unregister(worker_id="w0"), "K-worker")
    assert svc.registry.get("w0") is None


def test_a_worker_on_a_new_connection_is_asked_to_register_again() -> None:
    svc = _registered_router()
    reply = svc.handle(b"c-new", Heartbeat(worker_id="w0", load=WorkerLoad()), "K-worker")
    assert isinstance(reply, ErrorReply) and reply.code == "not_registered"
    ack = svc.handle(b"c-new", RegisterWorker(request_id="r2", info=INFO, protocol_version=PROTOCOL_VERSION),
                     "K-worker")
    assert isinstance(ack, RegisterAck)
    assert svc.handle(b"c-new", Heartbeat(worker_id="w0", load=WorkerLoad()), "K-worker") is None
    old = svc.handle(b"c-w0", Heartbeat(worker_id="w0", load=WorkerLoad()), "K-worker")  # the old connection
    assert isinstance(old, ErrorReply) and old.code == "not_registered" and svc._identities["w0"] == b"c-new"
    assert _refused(svc, "Heartbeat") == 2


@asynccontextmanager
async def _running(service: RouterService):
    ready = asyncio.Event()
    task = asyncio.create_task(service.run(ready))
    await asyncio.wait_for(ready.wait(), 10)
    try:
        yield service
    finally:
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass


async def _until(check, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    assert check()


async def test_through_curve_sockets_a_frontend_key_cannot_unregister_a_worker(tmp_path: Path) -> None:
    root = make_curve_keys(tmp_path / "keys")
    keys = {s: TransportConfig(curve=load_curve_keys(root / s)) for s in ("router", "worker", "frontend")}
    router = RouterService(RouterConfig(endpoint="tcp://127.0.0.1:0", transport=keys["router"]))
    async with _running(router) as r:
        ctx = SecureContext(None)
        worker = Client(ctx.ctx, r.endpoint, keys["worker"].toward("router"))
        liar = Client(ctx.ctx, r.endpoint, keys["frontend"].toward("router"))
        pub = ctx.ctx.socket(zmq.PUB)
        try:
            ack = await worker.request(RegisterWorker(request_id="r", info=INFO, protocol_version=PROTOCOL_VERSION), 5)
            assert isinstance(ack, RegisterAck)
            assert r._keys["w0"] == keys["worker"].curve.public.decode()  # bound to the key ZAP proved
            await liar.send(Unregister(worker_id="w0"))
            await liar.send(KvSnapshot(request_id="s", worker_id="w0", event_id=-1, tier_blocks=()))
            # The frontend's key publishing KV events for w0 on the events socket: refused by kind.
            secure_client(pub, keys["frontend"].toward("router").curve)
            pub.connect(ack.events_endpoint)
            fake = KvEvents(worker_id="w0", event_id=0, events=(
                BlockStored(block_hashes=(7,), parent_hash=None, tier="device"),))
            await _until(lambda: (pub.send(protocol.encode(fake)), _refused(r, "KvEvents") > 0)[1])
            await _until(lambda: _refused(r, "Unregister") == 1 and _refused(r, "KvSnapshot") == 1)
            listed = await liar.request(ListWorkers(request_id=new_id("l")), 5)  # still served, w0 still there
            assert isinstance(listed, WorkerList) and [w.worker_id for w in listed.workers] == ["w0"]
            assert r.index.tracker.awaiting_snapshot("w0") and r.index.overlaps([7]) == {}
            await worker.send(Unregister(worker_id="w0"))  # the worker itself: done
            await _until(lambda: r.registry.get("w0") is None)
        finally:
            pub.close(linger=0)
            await worker.close()
            await liar.close()
            ctx.close()
