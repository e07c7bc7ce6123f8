"""The router process: worker registry, prefix index and the route RPC.

It decides and never touches tokens' data path: the frontend and workers move tokens, NIXL moves KV.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import structlog

from common import protocol, tracing
from common.addresses import advertised_events
from common.errors import NoWorkerError, ProtocolError, RegistrationRefused
from common.hashing import adapter_seed, block_hashes
from common.loop_socket import LoopSocket
from common.protocol import (
    ErrorReply, Heartbeat, KvEvents, KvSnapshot, KvSnapshotRequest, ListWorkers, Message, RegisterAck, RegisterTier,
    RegisterWorker, Route, RouteRequest, RoleSet, SetRole, Unregister, WorkerRef,
)
from common.router_link import bind_events_subscriber
from common.security import client_kinds
from common.transport import Server, TransportConfig, new_id, open_context, oversized, peer_key, serve_requests
from services.router.authz import Bindings, Gate
from services.router.cost import handoff_due_s
from services.router.approx_index import ApproxIndex
from services.router.defaults import ROUTER_ENDPOINT
from services.router.event_watch import EventWatch
from services.router.index import PrefixIndex, TierOverlap
from services.router.metrics import RouterMetrics
from services.router.policy import Policy, PolicyConfig
from services.router.registry import DECODE_ROLES, PREFILL_ROLES, Registry, check_protocol_version
from services.router.remote_tier import remote_tier
from services.router.overlaps import merged_overlaps
from services.router.transfer_samples import learn_links, learn_tiers, show_tiers
from services.router.roles import RoleSwitcher
from services.router.snapshot_asks import ask_snapshots
from services.router.tier_registry import TierRegistry
from services.router.tier_speeds import TierSpeeds
from services.router.topology import Topology

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class RouterConfig:
    endpoint: str = ROUTER_ENDPOINT
    # SUB socket workers publish KV events to; port 0 picks a free one.
    events_endpoint: str = "tcp://127.0.0.1:0"
    # What workers are told to connect to, when the bind address is not reachable as is: an endpoint or a bare
    # host (the bound port on it). "" tells the bound endpoint; a wildcard one is dialed by each worker at the
    # host it reaches the router at (common/addresses.py: dialable).
    events_advertise: str = ""
    # Approximate mode (engines without KV events): how long a routed prefix counts as cached there.
    approx_ttl_s: float = 120.0
    # Workers with KV events: how long a routed prompt's blocks count as on that worker before its events
    # say so (they only come once the prefill has run). Without it, requests for a prefix that arrive while
    # its first prefill runs see no overlap anywhere and are spread, each recomputing it. 0: off.
    pending_ttl_s: float = 3.0
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # A worker silent this long is dropped (heartbeats come every ~0.25 s).
    # Generous on purpose: a starved but healthy worker must not be dropped (its requests would fail over).
    heartbeat_timeout_s: float = 5.0
    # How often sources awaiting a KV snapshot are checked, and how long an unanswered ask waits to be repeated.
    snapshot_retry_s: float = 1.0
    transport: TransportConfig = field(default_factory=TransportConfig)
    metrics_port: int = 0  # 0 = no metrics endpoint
    metrics_host: str = "127.0.0.1"  # bind address of /metrics
    seed: int = 0


class RouterService:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.registry = Registry()
        self.index = PrefixIndex()
        self.approx = ApproxIndex(ttl_s=config.approx_ttl_s)
        self.event_watch = EventWatch()
        self.pending = ApproxIndex(ttl_s=config.pending_ttl_s) if config.pending_ttl_s > 0 else None
        # Each worker's DEALER identity on our ROUTER socket, to ask it for a KV snapshot.
        self._identities: dict[str, bytes] = {}
        # The CURVE key (z85) each worker and tier registered with ("" without CURVE): what it says later must
        # come from that key and that identity (services/router/authz.py).
        self._keys: dict[str, str] = {}
        self.tiers = TierRegistry()  # registered kvtier processes (shared KV sources)
        self.events_endpoint = ""
        # Link bandwidths learned from the transfers workers report (pulls, pushes): the kv policy prices KV moves.
        self.topology = Topology(config.policy.cost.topology)
        self.policy = Policy(config.policy, seed=config.seed, topology=self.topology)
        # Tier speeds learned from the workers' tier loads; the configured ones until then.
        self.tier_speeds = TierSpeeds(config.policy.tiers)
        self.metrics = RouterMetrics()
        self.gate = Gate(Bindings(self._identities, self._keys), self.metrics.messages_refused)
        show_tiers(self.tier_speeds, self.metrics)
        self._server: Server | None = None
        self.endpoint = ""
        self.roles = RoleSwitcher(self.registry, self.metrics, self._identities, self._send)
        self._snapshot_due = asyncio.Event()  # a source began to await its snapshot: ask it now

    async def run(self, ready: asyncio.Event | None = None) -> None:
        secure = open_context(self.config.transport)
        ctx = secure.ctx
        if self.config.transport.curve is not None:
            self.gate.kinds = client_kinds(self.config.transport.curve)
        self._server = Server(ctx, self.config.endpoint, self.config.transport, read_keys=True)
        self.endpoint = self._server.endpoint
        sub, bound = bind_events_subscriber(ctx, self.config.transport, self.config.events_endpoint)
        self.events_endpoint = advertised_events(bound, self.config.events_advertise)
        if self.config.metrics_port:
            self.metrics.serve(self.config.metrics_port, self.config.metrics_host)
        loop = asyncio.get_running_loop()
        snapshots = ask_snapshots(self.index.tracker, self._snapshot_due, self.config.snapshot_retry_s,
                                  self._ask_snapshot)
        events = LoopSocket(sub)  # read off pyzmq's asyncio layer (a future and two ZMQ_EVENTS checks a message)
        background = [loop.create_task(self._reap_loop()), loop.create_task(self._events_loop(events)),
                      loop.create_task(snapshots), loop.create_task(self.roles.run())]
        log.info("router_ready", endpoint=self.endpoint, policy=self.config.policy.policy)
        if ready is not None:
            ready.set()
        try:
            await serve_requests(self._server, self.handle, "router", with_keys=True)
        finally:
            for task in background:
                task.cancel()
            events.close()
            sub.close(linger=0)
            self._server.close()
            secure.close()

    def handle(self, identity: bytes, msg: Message, key: str = "") -> Message | None:
        """One message from the peer ``identity`` whose CURVE key is ``key`` ("" without CURVE)."""
        now_s = time.monotonic()
        verdict = self.gate.check(identity, key, msg, now_s)
        if verdict is not True:
            return verdict or None
        match msg:
            case RouteRequest():
                with tracing.remote_span("router.route", msg.traceparent, num_tokens=len(msg.token_ids)):
                    return self._route(msg)
            case Heartbeat(worker_id=worker_id) if worker_id in self.tiers:
                self.tiers.beat(worker_id, now_s)
                return None
            case RegisterTier(request_id=rid, tier_id=tier_id):
                if (refused := self._refused(rid, tier_id, msg.protocol_version)) is not None:
                    return refused
                # A (re-)registration starts the tier's blocks over; its events (batch 0 = all it holds)
                # rebuild them. Its blocks count for every worker.
                self.index.remove_worker(tier_id)
                self.index.mark_shared(tier_id)
                self.index.expect_snapshot(tier_id)  # no credit for its blocks until its snapshot is loaded
                self._snapshot_due.set()
                self.tiers.register(msg, now_s)
                self._identities[tier_id] = identity
                self._keys[tier_id] = key
                log.info("tier_registered", tier_id=tier_id, endpoint=msg.endpoint, block_bytes=msg.block_bytes,
                         nixl_agent=msg.nixl_agent, node=msg.node, zone=msg.zone)
                return RegisterAck(request_id=rid, worker_id=tier_id, events_endpoint=self.events_endpoint)
            case Heartbeat(worker_id=worker_id, load=load, draining=draining):
                was_draining = (entry := self.registry.get(worker_id)) is not None and entry.draining
                if not self.registry.report(worker_id, load, now_s, draining):
                    # A router that restarted does not know the worker: ask it to register again.
                    return ErrorReply(request_id=f"hb-{worker_id}", code="not_registered", message=worker_id)
                if draining and not was_draining:
                    log.info("worker_draining", worker_id=worker_id, num_running=load.num_running,
                             num_waiting=load.num_waiting)
                self.metrics.observe_load(worker_id, load)
                self.roles.reported(worker_id, msg.role)  # the worker's role, as it says (a SetRole moved it)
                self.registry.set_adapters(worker_id, msg.lora_names)  # None: none loaded or unloaded since
                if msg.transfers:
                    learn_links(self.registry, self.topology, self.metrics, worker_id, msg.transfers)
                if msg.tier_loads:
                    learn_tiers(self.tier_speeds, self.policy, self.metrics, msg.tier_loads)
                return None
            case RegisterWorker(request_id=rid, info=info):
                if (refused := self._refused(rid, info.worker_id, msg.protocol_version)) is not None:
                    return refused
                self.registry.register(info, now_s)
                # A re-registration starts that worker's KV view from scratch; its events rebuild it.
                self.index.remove_worker(info.worker_id)
                if info.kv_events:
                    # Fail closed until its snapshot is loaded (the snapshot loop asks for it at once).
                    self.index.expect_snapshot(info.worker_id)
                    self._snapshot_due.set()
                self.approx.remove_worker(info.worker_id)
                if self.pending is not None:
                    self.pending.remove_worker(info.worker_id)
                self.topology.forget_worker(info.worker_id)  # a new engine: its pulls wire up anew
                self._identities[info.worker_id] = identity
                self._keys[info.worker_id] = key
                if info.kv_events:
                    self.event_watch.registered(info.worker_id, now_s)
                self.metrics.observe_worker(info)
                log.info("worker_registered", worker_id=info.worker_id, role=info.role, model=info.model,
                         endpoint=info.endpoint, num_blocks=info.num_blocks, block_size=info.block_size,
                         node=info.node, zone=info.zone)
                return RegisterAck(request_id=rid, worker_id=info.worker_id,
                                   events_endpoint=self.events_endpoint if info.kv_events else "")
            case Unregister(worker_id=worker_id):
                self._drop(worker_id, reason="unregistered")
                return None
            case ListWorkers(request_id=rid):
                return self.registry.listing(rid)
            case SetRole():  # planner or operator: answered now if refused, else once the worker confirmed
                return self.roles.request(identity, msg, now_s)
            case RoleSet():  # a worker's answer to a SetRole we forwarded
                self.roles.answered(msg, now_s)
                return None
            case KvSnapshot():
                if msg.worker_id not in self._identities:
                    return None  # a source we dropped since it was asked
                loaded = self.index.load_snapshot(msg.worker_id, msg)
                log.info("kv_snapshot_loaded", worker_id=msg.worker_id, num_blocks=loaded.num_blocks,
                         num_replayed=loaded.num_replayed, epoch=msg.epoch, event_id=msg.event_id)
                if loaded.needs_snapshot:
                    self.index.tracker.mark_asked(msg.worker_id, now_s)
                    return KvSnapshotRequest(request_id=new_id("snap"), worker_id=msg.worker_id)
                return None
            case _:
                raise ProtocolError(f"router does not handle {type(msg).__name__}")

    def local(self, msg: Message) -> Message:
        """A request from the process this router runs in (a frontend hosting it, common/local_router.py): no
        socket and no sender to check."""
        match msg:
            case RouteRequest():
                with tracing.remote_span("router.route", msg.traceparent, num_tokens=len(msg.token_ids)):
                    return self._route(msg)
            case ListWorkers(request_id=rid):
                return self.registry.listing(rid)
            case _:
                raise ProtocolError(f"router does not answer {type(msg).__name__} in process")

    def _refused(self, request_id: str, source_id: str, protocol_version: int) -> ErrorReply | None:
        """A registration's refusal when it speaks another protocol version, else None."""
        try:
            check_protocol_version(source_id, protocol_version)
        except RegistrationRefused as exc:
            log.error("registration_refused", worker_id=source_id, reason=str(exc))
            self.metrics.registrations_refused.inc()
            return ErrorReply(request_id=request_id, code="registration_refused", message=str(exc))
        return None

    def _route(self, req: RouteRequest) -> Message:
        start_s = time.perf_counter()
        excluded = (req.exclude_worker_ids, req.exclude_instance_ids, req.lora_name)
        if not (decode := self.registry.candidates(req.model, DECODE_ROLES, *excluded)):
            self.metrics.routes_failed.inc()
            return ErrorReply(request_id=req.request_id, code="no_worker", message=f"no decode-capable worker "
                              f"serves model {req.model!r}" + (f" with adapter {req.lora_name!r}" * bool(req.lora_name)))
        prefill = self.registry.candidates(req.model, PREFILL_ROLES, *excluded)
        entry = self.registry.get(decode[0].worker_id)
        assert entry is not None
        # An adapter's blocks live under its own seed: never credited to the base model's blocks of the same tokens.
        block_size, seed = entry.info.block_size, adapter_seed(entry.info.hash_seed, req.lora_name)
        hashes = block_hashes(req.token_ids, block_size, seed)
        overlaps = self._overlaps(hashes)
        held = self._overlaps(hashes, pending=False) if self.pending and self.pending.num_blocks else overlaps
        try:
            choice = self.policy.choose_route(hashes, len(req.token_ids), block_size, decode, prefill, overlaps, held)
        except NoWorkerError as exc:
            return ErrorReply(request_id=req.request_id, code="no_worker", message=str(exc))
        num_uncached = max(len(req.token_ids) - choice.num_cached_tokens_predicted, 0)
        local = choice.prefill_worker_id is None
        handoff = None if local else (handoff_due_s(time.monotonic(), choice.predicted_s), hashes[-1] if hashes else None)
        self.registry.note_routed(choice.decode_worker_id, num_uncached if local else 0, len(req.token_ids), handoff)
        if hashes:
            self.event_watch.routed(choice.decode_worker_id)
        self._note_approx(choice.decode_worker_id, hashes)
        prefill_ref = None
        if choice.prefill_worker_id is not None:
            self.registry.note_routed(choice.prefill_worker_id, num_uncached)
            self._note_approx(choice.prefill_worker_id, hashes)
            prefill_ref = self._ref(choice.prefill_worker_id)
        decode_entry = self.registry.get(choice.decode_worker_id) if local and self.tiers else None
        tier = "" if decode_entry is None else self._remote_tier(decode_entry, hashes, len(req.token_ids), block_size)
        self.metrics.observe_route(choice, len(hashes), time.perf_counter() - start_s)
        log.debug("route_chosen", request_id=req.request_id, decode=choice.decode_worker_id, reason=choice.reason,
                  prefill=choice.prefill_worker_id, predicted_s=round(choice.predicted_s, 4), num_prompt_tokens=len(req.token_ids))
        return Route(request_id=req.request_id, decode=self._ref(choice.decode_worker_id), prefill=prefill_ref,
                     num_cached_tokens_predicted=choice.num_cached_tokens_predicted, kvtier_remote=tier)

    def _remote_tier(self, entry, hashes: list[int], num_prompt_tokens: int, block_size: int) -> str:
        pick = remote_tier(entry.info, self.registry.effective_load(entry), self.tiers.info, self.index,
                           self.topology, self.config.policy.cost, hashes, num_prompt_tokens, block_size)
        if pick.tier is None:
            return ""
        log.info("kvtier_remote_named", worker_id=entry.info.worker_id, tier_id=pick.tier.tier_id,
                 num_blocks=pick.num_extra_blocks, seconds_saved=round(pick.seconds_saved, 4))
        return pick.tier.endpoint

    def _send(self, identity: bytes, msg: Message) -> None:
        if self._server is not None:
            self._server.send_nowait(identity, msg)

    def _ref(self, worker_id: str) -> WorkerRef:
        entry = self.registry.get(worker_id)
        assert entry is not None
        return WorkerRef(worker_id=worker_id, endpoint=entry.info.endpoint, instance_id=entry.info.instance_id)

    def _overlaps(self, hashes: list[int], pending: bool = True) -> dict[str, TierOverlap]:
        # pending=False: what each worker holds now. With a shared tier, name every worker (the tier's blocks count).
        return merged_overlaps(self.index, self.approx, self.pending if pending else None, hashes,
                               [e.info.worker_id for e in self.registry.workers()] if self.tiers else None)

    def _note_approx(self, worker_id: str, hashes: list[int]) -> None:
        entry = self.registry.get(worker_id)
        if entry is not None and not entry.info.kv_events:
            self.approx.record(worker_id, hashes)
        elif entry is not None and self.pending is not None:
            self.pending.record(worker_id, hashes)

    async def _events_loop(self, sub: LoopSocket) -> None:
        read_keys = self.config.transport.curve is not None
        while True:
            key = ""
            if read_keys:  # zero-copy, to read the CURVE key the publisher's connection proved
                frame = await sub.recv(copy=False)
                key, data = peer_key(frame), frame.bytes
            else:
                data = await sub.recv()
            if oversized(data, self.config.transport.max_message_bytes, socket="kv_events"):
                continue  # the batch's number is then missing: the gap asks that source for a snapshot
            try:
                msg = protocol.decode(data)
            except ProtocolError as exc:
                log.warning("dropped_event", reason=str(exc))
                continue
            match msg:
                case KvEvents():
                    if self.gate.check(b"", key, msg, time.monotonic()) is True:
                        self._apply_events(msg)
                case _:
                    log.warning("dropped_event", reason=f"unexpected {type(msg).__name__} on the events socket")

    def _apply_events(self, msg: KvEvents) -> None:
        identity = self._identities.get(msg.worker_id)
        if identity is None or (self.registry.get(msg.worker_id) is None and msg.worker_id not in self.tiers):
            return  # a worker we dropped; it re-registers and republishes
        check = self.index.apply_events(msg)
        self.registry.note_stored(msg.worker_id, msg.events)
        self.event_watch.event(msg.worker_id, time.monotonic())
        self.metrics.events_applied.inc(len(msg.events))
        if check.needs_snapshot:
            log.warning("kv_event_gap", worker_id=msg.worker_id, expected=check.expected_event_id, got=msg.event_id)
            self.metrics.event_gaps.inc()
            assert self._server is not None
            self.index.tracker.mark_asked(msg.worker_id, time.monotonic())
            self._server.send_nowait(identity, KvSnapshotRequest(request_id=new_id("snap"), worker_id=msg.worker_id))

    def _drop(self, worker_id: str, reason: str) -> None:
        if self.registry.unregister(worker_id):
            self._forget(worker_id)
            log.warning("worker_dropped", worker_id=worker_id, reason=reason)

    def _forget(self, worker_id: str) -> None:
        self.event_watch.forget(worker_id)
        self.topology.forget_worker(worker_id)
        self.index.remove_worker(worker_id)
        self.approx.remove_worker(worker_id)
        if self.pending is not None:
            self.pending.remove_worker(worker_id)
        self._identities.pop(worker_id, None)
        self._keys.pop(worker_id, None)
        self.metrics.forget_worker(worker_id)

    def _expire_tiers(self, now_s: float) -> list[str]:
        """Drop kvtiers silent past the heartbeat timeout: their blocks are credited to nobody any more."""
        dead = self.tiers.expire(now_s, self.config.heartbeat_timeout_s)
        for tier_id in dead:
            self.index.remove_worker(tier_id)
            self._identities.pop(tier_id, None)
            self._keys.pop(tier_id, None)
            log.warning("tier_dropped", tier_id=tier_id, reason="missed heartbeats")
        return dead

    def _ask_snapshot(self, source_id: str) -> None:
        identity = self._identities.get(source_id)
        if identity is not None and self._server is not None:
            self._server.send_nowait(identity, KvSnapshotRequest(request_id=new_id("snap"), worker_id=source_id))

    async def _reap_loop(self) -> None:
        interval_s = self.config.heartbeat_timeout_s / 4
        while True:
            await asyncio.sleep(interval_s)
            self.approx.expire()
            self.metrics.index_blocks.set(self.index.num_blocks)
            for worker_id in self.event_watch.newly_stale(time.monotonic()):
                # Still routed by load, but its prefixes are invisible: say so, loudly.
                log.error("kv_events_stale", worker_id=worker_id, stale_s=self.event_watch.stale_s)
                self.metrics.events_stale.inc()
            if self.pending is not None:
                self.pending.expire()
            self._expire_tiers(time.monotonic())
            for src_node, dst_node in self.topology.expire(time.monotonic()):
                self.metrics.forget_link(src_node, dst_node)
            for worker_id in self.registry.expire(time.monotonic(), self.config.heartbeat_timeout_s):
                self._forget(worker_id)
                log.warning("worker_dropped", worker_id=worker_id, reason="missed heartbeats")
