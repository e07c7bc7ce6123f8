"""The kvtier process: a shared KV store (host pool + NVMe slab) behind a ROUTER socket (docs/architecture.md#kv-tiers).

Workers send ``TierStore`` (blocks their engine evicted, or wrote through after prefill) and ``TierLookup``
(the continuation of a prompt's locally cached prefix); ``GetStats`` answers ``TierStats``. kvtier
registers with the router (``RegisterTier``), heartbeats, and publishes its host/disk changes as numbered
``KvEvents`` under its tier id, so the router credits its blocks to every worker (a shared source).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path

import structlog
import zmq
import zmq.asyncio

from common import protocol
from common.addresses import advertised_endpoint
from common.errors import ProtocolError
from common.protocol import (
    PROTOCOL_VERSION,
    GetStats,
    Heartbeat,
    KvEvent,
    KvEvents,
    KvSnapshot,
    Message,
    RegisterTier,
    StoredBlock,
    TierBlock,
    TierBlocks,
    TierLookup,
    TierStats,
    TierStore,
    TierStored,
    WorkerLoad,
)
from common.router_link import EventsSocket, RouterLink, first_registration, send_all, split_endpoints
from common.transport import Server, TransportConfig, open_context, serve_requests
from services.kvtier.metrics import KvTierMetrics
from common.nixl import make_nixl_agent
from services.kvtier.pool import GIB, agent_name
from services.kvtier.store import BlockStore

log = structlog.get_logger(__name__)

# The mock engine's default block: 36,864 KV bytes per token (12 layers, K+V, 768 hidden, bf16) * 32 tokens.
DEFAULT_BLOCK_BYTES = 36864 * 32


@dataclass(frozen=True)
class KvTierConfig:
    tier_id: str = "kvtier-0"
    endpoint: str = "tcp://127.0.0.1:5570"
    # Endpoint registered with the router for workers to dial: an endpoint, or a bare host (the bound port on
    # it); "" = the bound one (a wildcard is refused: common/addresses.py).
    advertise_endpoint: str = ""
    # The machine whose DRAM and NVMe this tier serves (one kvtier per node) and its optional zone.
    node: str = ""
    zone: str = ""
    # "" = standalone: no registration, no events (the router will not credit kvtier's blocks).
    router_endpoint: str = ""
    host_bytes: int = GIB
    disk_bytes: int = 0
    disk_dir: Path | None = None
    # Fixed slot size; larger blocks are refused.
    block_bytes: int = DEFAULT_BLOCK_BYTES
    # Host blocks go to disk on eviction only if looked up at least this many times (else dropped).
    disk_min_hits: int = 1
    # Register the pool with NIXL (UCX + POSIX). False, or a failure, leaves inline bytes only.
    nixl: bool = True
    # Disk I/O through NIXL's POSIX backend when it works; False forces os.pread/pwrite.
    disk_nixl: bool = True
    heartbeat_interval_s: float = 0.25
    register_timeout_s: float = 2.0
    # Events go out as soon as a handled message made them (the loop is woken, not polling: a 10 ms poll cost
    # ~10 ms of CPU a second on the prefill engine's core, where `up` puts kvtier); NIXL notifications are
    # drained after each message and at least this often.
    notif_drain_interval_s: float = 1.0
    # Bytes of block data in one TierBlocks reply (a message stays under the transport's limit).
    max_reply_bytes: int = 12 * 1024 * 1024
    # With a disk tier: pool slots (beyond the host tier's) that disk blocks are read into for workers to READ
    # with NIXL; up to this many bytes of them per lookup reply. Untouched pages cost no memory.
    bounce_bytes: int = 64 * 1024 * 1024
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"  # bind address of /metrics
    transport: TransportConfig = field(default_factory=TransportConfig)


class KvTierService:
    def __init__(self, config: KvTierConfig) -> None:
        self.config = config
        self.metrics = KvTierMetrics()
        self.store: BlockStore | None = None
        self.endpoint = ""
        self._server: Server | None = None
        # One link per router of the --router list (replicas); one PUB socket carries events to all of them.
        self._links: list[RouterLink] = []
        self._pub: EventsSocket | None = None
        self._next_event_id = 0
        # Random per process start (KvEvents.epoch): a restarted kvtier's numbering is told apart from the old.
        self.epoch = int.from_bytes(os.urandom(6), "little")
        self._ctx: zmq.asyncio.Context | None = None
        self._nixl_metadata = b""
        self._wake = asyncio.Event()  # set by each handled message: events (and notifications) to flush

    async def run(self, ready: asyncio.Event | None = None) -> None:
        cfg = self.config
        secure = open_context(cfg.transport)
        ctx = self._ctx = secure.ctx
        self._server = Server(ctx, cfg.endpoint, cfg.transport)
        self.endpoint = advertised_endpoint(self._server.endpoint, cfg.advertise_endpoint)
        store = self.store = BlockStore(cfg.tier_id, cfg.host_bytes, cfg.block_bytes, cfg.disk_bytes, cfg.disk_dir,
                                        cfg.disk_min_hits, None, cfg.disk_nixl, self.metrics,
                                        num_bounce=max(1, cfg.bounce_bytes // cfg.block_bytes))
        self.metrics.capacity.labels(tier="host").set(store.index.num_slots("host"))
        self.metrics.capacity.labels(tier="disk").set(store.index.num_slots("disk"))
        if cfg.metrics_port:
            self.metrics.serve(cfg.metrics_port, cfg.metrics_host)
        background: list[asyncio.Task[None]] = []
        try:
            loop = asyncio.get_running_loop()
            if cfg.router_endpoint:
                self._pub = EventsSocket(ctx, cfg.transport)
                self._links = [
                    RouterLink(ctx, endpoint, cfg.transport, source_id=cfg.tier_id,
                               make_registration=self._registration, make_snapshot=self._snapshot,
                               on_events_endpoint=self._pub.connect, register_timeout_s=cfg.register_timeout_s)
                    for endpoint in split_endpoints(cfg.router_endpoint)]
                registering = [loop.create_task(link.keep_registered()) for link in self._links]
                background += registering
                await first_registration(self._links, registering)
                background.append(loop.create_task(self._heartbeat_loop()))
            background.append(loop.create_task(self._events_loop()))
            if cfg.nixl:
                background.append(loop.create_task(self._attach_nixl()))
            log.info("kvtier_ready", tier_id=cfg.tier_id, endpoint=self.endpoint, host_slots=store.pool.num_slots,
                     disk_slots=store.index.num_slots("disk"), block_bytes=cfg.block_bytes,
                     nixl=store.pool.registered, disk_io=store.disk.io_mode if store.disk else "")
            if ready is not None:
                ready.set()
            await self._serve()
        finally:
            for task in background:
                task.cancel()
            if self._pub is not None:
                self._pub.close()
            for link in self._links:
                await link.close()
            self._server.close()
            store.close()
            secure.close()

    async def _attach_nixl(self) -> None:
        """Make the NIXL agent off the event loop (importing NIXL imports torch: seconds), then register."""
        assert self.store is not None
        nixl = await asyncio.to_thread(make_nixl_agent, agent_name(self.config.tier_id))
        if nixl is not None:
            self.store.attach_nixl(nixl)
        log.info("kvtier_nixl", registered=self.store.pool.registered,
                 disk_io=self.store.disk.io_mode if self.store.disk else "")

    # ------------------------------------------------------------------------------------------ serving

    async def _serve(self) -> None:
        assert self._server is not None
        await serve_requests(self._server, lambda _identity, msg: self.handle(msg), "kvtier")

    def handle(self, msg: Message) -> Message | None:
        self._wake.set()  # what it stores, evicts or demotes is published once this burst is handled
        return self._handle(msg)

    def _handle(self, msg: Message) -> Message | None:
        store = self.store
        assert store is not None
        match msg:
            case TierStore(request_id=rid, blocks=blocks):
                stored, present, rejected = store.store(blocks, msg.model_id)
                if rejected:
                    log.warning("blocks_rejected", worker_id=msg.worker_id, num_rejected=rejected)
                return TierStored(request_id=rid, num_stored=stored, num_present=present, num_rejected=rejected)
            case TierLookup(request_id=rid, block_hashes=hashes, max_blocks=max_blocks, with_data=False):
                held = store.index.peek(hashes, max_blocks, msg.model_id)
                return TierBlocks(request_id=rid, blocks=tuple(
                    TierBlock(block_hash=e.block_hash, checksum=e.checksum, size=e.size, tier=e.tier) for e in held))
            case TierLookup(request_id=rid, block_hashes=hashes, max_blocks=max_blocks, host_slots=True):
                blocks, truncated = store.lookup_slots(hashes, max_blocks, self.config.max_reply_bytes,
                                                       msg.model_id)
                agent = store.pool.nixl.name if store.pool.registered and store.pool.nixl is not None else ""
                return TierBlocks(request_id=rid, blocks=tuple(blocks), truncated=truncated, nixl_agent=agent)
            case TierLookup(request_id=rid, block_hashes=hashes, max_blocks=max_blocks):
                cap = max(1, self.config.max_reply_bytes // store.block_bytes)
                cap = min(cap, max_blocks) if max_blocks else cap
                blocks = store.lookup(hashes, cap, model_id=msg.model_id)
                return TierBlocks(request_id=rid, blocks=tuple(blocks),
                                  truncated=len(blocks) == cap and len(hashes) > cap)
            case GetStats(request_id=rid):
                return self.stats(rid)
            case _:
                raise ProtocolError(f"kvtier does not handle {type(msg).__name__}")

    def stats(self, request_id: str) -> TierStats:
        store = self.store
        assert store is not None
        c, index = store.index.counters, store.index
        return TierStats(
            request_id=request_id, tier_id=self.config.tier_id, block_bytes=store.block_bytes,
            host_slots=index.num_slots("host"), host_used=index.num_used("host"),
            disk_slots=index.num_slots("disk"), disk_used=index.num_used("disk"),
            hits_host=c.hits_host, hits_disk=c.hits_disk, misses=c.misses, blocks_stored=c.stored,
            bytes_in=store.bytes_in, bytes_out=store.bytes_out, evictions_host=c.evictions_host,
            evictions_disk=c.evictions_disk, demotions=c.demotions,
            checksum_failures=store.num_checksum_failures,
            disk_io=store.disk.io_mode if store.disk else "", nixl=store.pool.registered,
            **self._nixl_info())

    def _nixl_info(self) -> dict[str, object]:
        """What a worker needs to READ the host pool with NIXL (empty until the pool is registered)."""
        pool = self.store.pool if self.store is not None else None
        if pool is None or not pool.registered or pool.nixl is None:
            return {}
        if not self._nixl_metadata:
            self._nixl_metadata = pool.nixl.agent.get_agent_metadata()  # type: ignore[attr-defined]
        return {"nixl_agent": pool.nixl.name, "nixl_metadata": self._nixl_metadata, "pool_addr": pool.base_addr,
                "pool_slots": pool.total_slots}

    # ------------------------------------------------------------------------------------------- router

    def _registration(self, request_id: str) -> RegisterTier:
        assert self.store is not None
        return RegisterTier(request_id=request_id, tier_id=self.config.tier_id, protocol_version=PROTOCOL_VERSION,
                            endpoint=self.endpoint, block_bytes=self.store.block_bytes,
                            nixl_agent=agent_name(self.config.tier_id) if self.config.nixl else "",
                            node=self.config.node, zone=self.config.zone)

    def _publish(self, events: tuple[KvEvent, ...]) -> None:
        # Numbered even before a router listens: each router starts from a snapshot tagged with this numbering.
        msg = KvEvents(worker_id=self.config.tier_id, event_id=self._next_event_id, events=events, epoch=self.epoch)
        self._next_event_id += 1
        if self._pub is not None and self._pub.connected and not self._pub.send(protocol.encode(msg)):
            log.warning("kv_events_dropped", tier_id=self.config.tier_id, event_id=msg.event_id)

    def flush_events(self) -> None:
        assert self.store is not None
        events = self.store.index.drain_events()
        if events:
            self._publish(tuple(events))

    async def _events_loop(self) -> None:
        while True:
            self.flush_events()
            self._drain_nixl_notifs()
            try:
                await asyncio.wait_for(self._wake.wait(), self.config.notif_drain_interval_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    def _drain_nixl_notifs(self) -> None:
        """Workers READ the pool without notifications, but a target that leaves any undrained can hang its
        initiators (docs/architecture.md#nixl-facts): drain whatever arrives."""
        pool = self.store.pool if self.store is not None else None
        if pool is not None and pool.registered and pool.nixl is not None:
            pool.nixl.agent.get_new_notifs()  # type: ignore[attr-defined]

    def _snapshot(self, request_id: str) -> KvSnapshot:
        assert self.store is not None
        self.flush_events()
        blocks = tuple(StoredBlock(block_hash=h, parent_hash=None, tier=t) for h, t in self.store.index.snapshot())
        return KvSnapshot(request_id=request_id, worker_id=self.config.tier_id, event_id=self._next_event_id - 1,
                          tier_blocks=blocks, epoch=self.epoch)

    async def _heartbeat_loop(self) -> None:
        assert self.store is not None
        seq = 0
        while True:
            seq += 1
            index = self.store.index
            load = WorkerLoad(num_total_blocks=index.num_slots("host"),
                              num_free_blocks=index.num_slots("host") - index.num_used("host"))
            send_all(self._links, Heartbeat(worker_id=self.config.tier_id, load=load, seq=seq))
            await asyncio.sleep(self.config.heartbeat_interval_s)

