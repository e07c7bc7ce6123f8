"""CURVE on every socket kind, on real sockets: a peer with an allowed key is served; one without CURVE, or
with a valid key that is not on that server's allow-list, is refused, and the server keeps serving."""

from __future__ import annotations

import asyncio
import stat
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import zmq

from common import protocol
from common.errors import SplitserveError, TransportTimeout
from common.protocol import (
    PROTOCOL_VERSION,
    BlockStored,
    GetStats,
    KvEvents,
    KvSnapshot,
    ListWorkers,
    RegisterAck,
    RegisterWorker,
    TierStats,
    WorkerInfo,
    WorkerList,
    WorkerStats,
)
from common.security import (
    SecureContext,
    load_curve_keys,
    make_curve_keys,
    secure_client,
)
from common.timing import TimingModel
from common.transport import Client, TransportConfig, new_id
from services.kvtier.service import KvTierConfig, KvTierService
from services.router.service import RouterConfig, RouterService
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.engine import MockEngine
from services.worker.config import WorkerConfig
from services.worker.service import WorkerService


@pytest.fixture()
def keys(tmp_path: Path) -> dict[str, TransportConfig]:
    """Each service's transport with its own keys, and an "outsider": the frontend of another cluster (a valid
    CURVE key that no server of ours lists)."""
    ours, theirs = make_curve_keys(tmp_path / "ours"), make_curve_keys(tmp_path / "theirs")
    out = {s: TransportConfig(curve=load_curve_keys(ours / s)) for s in ("router", "worker", "kvtier", "frontend")}
    outsider = load_curve_keys(theirs / "frontend")
    # It knows our servers' public keys (they are public), just not an allowed client key.
    out["outsider"] = TransportConfig(curve=type(outsider)(
        "outsider", outsider.public, outsider.secret, out["frontend"].curve.server_keys, outsider.allowed_clients_dir))
    return out


def test_keys_make_writes_per_service_keys_secrets_0600(tmp_path: Path) -> None:
    out = make_curve_keys(tmp_path / "k")
    for service in ("router", "worker", "kvtier", "frontend", "planner"):
        secret = out / service / f"{service}.key_secret"
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert sorted(p.name for p in (out / "router" / "clients").iterdir()) == [
        "frontend.key", "kvtier.key", "planner.key", "worker.key"]
    assert sorted(p.name for p in (out / "kvtier" / "clients").iterdir()) == ["worker.key"]
    assert sorted(p.name for p in (out / "worker" / "servers").iterdir()) == ["kvtier.key", "router.key"]
    keys = load_curve_keys(out / "worker")
    assert keys.service == "worker" and set(keys.server_keys) == {"router", "kvtier"}
    (out / "worker" / "worker.key_secret").chmod(0o640)  # group read: a Kubernetes Secret volume with fsGroup
    assert load_curve_keys(out / "worker").service == "worker"
    (out / "worker" / "worker.key_secret").chmod(0o644)
    with pytest.raises(SplitserveError, match="readable by others"):
        load_curve_keys(out / "worker")


async def _refused_then_served(endpoint: str, server: str, msg_factory, expected: type,
                               keys: dict[str, TransportConfig], member: str) -> None:
    plain, outsider, ok = SecureContext(None), SecureContext(None), SecureContext(None)
    clients = [Client(plain.ctx, endpoint, TransportConfig()),
               Client(outsider.ctx, endpoint, keys["outsider"].toward(server))]
    good = Client(ok.ctx, endpoint, keys[member].toward(server))
    try:
        for refused in clients:
            with pytest.raises(TransportTimeout):
                await refused.request(msg_factory(), timeout_s=0.5)
        assert isinstance(await good.request(msg_factory(), timeout_s=5), expected)  # still serving
    finally:
        for client in [*clients, good]:
            await client.close()
        for ctx in (plain, outsider, ok):
            ctx.close()


@asynccontextmanager
async def _running(service):
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


async def test_router_socket_refuses_unlisted_keys(keys) -> None:
    async with _running(RouterService(RouterConfig(endpoint="tcp://127.0.0.1:0", transport=keys["router"]))) as r:
        await _refused_then_served(r.endpoint, "router", lambda: ListWorkers(request_id=new_id("t")), WorkerList,
                                   keys, "frontend")


async def test_router_events_socket_ignores_unlisted_publishers(keys) -> None:
    async with _running(RouterService(RouterConfig(endpoint="tcp://127.0.0.1:0", transport=keys["router"]))) as r:
        ctx = SecureContext(None)
        worker = Client(ctx.ctx, r.endpoint, keys["worker"].toward("router"))
        info = WorkerInfo(worker_id="w", role="both", model="m", block_size=4, num_blocks=8,
                          endpoint="tcp://127.0.0.1:9", kv_events=True)
        ack = await worker.request(RegisterWorker(request_id="r", info=info, protocol_version=PROTOCOL_VERSION), 5)
        assert isinstance(ack, RegisterAck)
        await worker.send(KvSnapshot(request_id="s", worker_id="w", event_id=-1, tier_blocks=()))
        pubs = {}
        for who in ("outsider", "worker"):
            sock = pubs[who] = ctx.ctx.socket(zmq.PUB)
            secure_client(sock, keys[who].toward("router").curve)
            sock.connect(ack.events_endpoint)
        try:
            for event_id, who in enumerate(("outsider", "worker")):
                batch = KvEvents(worker_id="w", event_id=event_id, events=(
                    BlockStored(block_hashes=(100 + event_id,), parent_hash=None, tier="device"),))
                for _ in range(40):  # PUB drops until the subscription is through: publish for a while
                    await pubs[who].send(protocol.encode(batch))
                    await asyncio.sleep(0.02)
            assert r.index.overlaps([100]) == {}  # the outsider's batch never arrived
            assert r.index.overlaps([101]) == {}  # and so the worker's batch 1 came after a gap: held
            assert r.index.tracker.awaiting_snapshot("w")
        finally:
            for sock in pubs.values():
                sock.close(linger=0)
            await worker.close()
            ctx.close()


async def test_worker_socket_refuses_unlisted_keys(keys) -> None:
    async with _running(RouterService(RouterConfig(endpoint="tcp://127.0.0.1:0", transport=keys["router"]))) as r:
        engine = MockEngine(MockEngineConfig(num_blocks=16, block_size=4, max_model_len=64,
                                             timing=TimingModel(speedup=float("inf"))))
        worker = WorkerService(WorkerConfig(worker_id="w", role="both", model="m", router_endpoint=r.endpoint,
                                            transport=keys["worker"]), engine)
        async with _running(worker):
            await _refused_then_served(worker.endpoint, "worker", lambda: GetStats(request_id=new_id("t")),
                                       WorkerStats, keys, "frontend")


async def test_kvtier_socket_refuses_unlisted_keys(keys) -> None:
    tier = KvTierService(KvTierConfig(endpoint="tcp://127.0.0.1:0", host_bytes=64 * 1024, block_bytes=1024,
                                      nixl=False, transport=keys["kvtier"]))
    async with _running(tier):
        # A frontend's key is valid in our cluster but kvtier lists only workers.
        frontend = keys["frontend"].curve
        wrong_kind = TransportConfig(curve=replace(frontend, server_keys=keys["worker"].curve.server_keys))
        await _refused_then_served(tier.endpoint, "kvtier", lambda: GetStats(request_id=new_id("t")), TierStats,
                                   keys | {"outsider": wrong_kind}, "worker")


def test_curve_dir_root_or_own_directory(tmp_path: Path) -> None:
    from cli.options import transport

    root = make_curve_keys(tmp_path / "k")
    assert transport(root, "worker").curve.service == "worker"  # the root: each service takes its own
    assert transport(root / "kvtier", "kvtier").curve.service == "kvtier"
    assert transport(None, "router").curve is None


async def test_worker_talks_only_to_the_router_key_it_knows(keys, tmp_path: Path) -> None:
    """Server authentication, the other half: an impostor router (another keypair, with an allow-list that would
    take our worker) never gets our worker's registration, so it can never send it requests on that connection
    (KvSnapshotRequest, not_registered) nor receive its KV events; the real router beside it does."""
    theirs = load_curve_keys(make_curve_keys(tmp_path / "impostor") / "router")
    impostor_keys = TransportConfig(curve=replace(theirs, allowed_clients_dir=keys["router"].curve.allowed_clients_dir))
    async with (_running(RouterService(RouterConfig(endpoint="tcp://127.0.0.1:0", transport=keys["router"]))) as real,
                _running(RouterService(RouterConfig(endpoint="tcp://127.0.0.1:0", transport=impostor_keys))) as fake):
        engine = MockEngine(MockEngineConfig(num_blocks=16, block_size=4, max_model_len=64,
                                             timing=TimingModel(speedup=float("inf"))))
        worker = WorkerService(WorkerConfig(worker_id="w", role="both", model="m", transport=keys["worker"],
                                            router_endpoint=f"{fake.endpoint},{real.endpoint}"), engine)
        async with _running(worker):
            await asyncio.sleep(2.0)  # the impostor's link retries registration meanwhile (every <= 2 s)
            assert [e.info.worker_id for e in real.registry.workers()] == ["w"]
            assert fake.registry.workers() == []


def test_keys_make_if_absent_keeps_a_full_set_and_remakes_a_partial_one(tmp_path: Path) -> None:
    """compose.yaml's `keys` service reruns at every `up`: the keys running services hold must stay."""
    from cli.cmd_tools import keys_make

    services = "router,worker,kvtier,frontend"
    out = tmp_path / "curve"
    keys_make(out=out, if_absent=True, services=services)
    first = (out / "router" / "router.key_secret").read_bytes()
    assert not (out / "planner").exists()  # only the services asked for
    keys_make(out=out, if_absent=True, services=services)
    assert (out / "router" / "router.key_secret").read_bytes() == first
    (out / "worker" / "worker.key_secret").unlink()  # a partial set: made again, all of it
    keys_make(out=out, if_absent=True, services=services)
    assert (out / "router" / "router.key_secret").read_bytes() != first
    assert load_curve_keys(out / "worker").server_keys["router"] == load_curve_keys(out / "router").public
    with pytest.raises(Exception, match="unknown services"):
        keys_make(out=out, if_absent=False, services="router,nobody")
