"""The worker process: one engine behind a ROUTER socket, registered with the router.

Frontends send ``Generate``/``Abort``/``GetStats``; the worker streams ``Tokens`` back to the sender. It
registers with the router, heartbeats its load and re-registers when a restarted router does not know it.

Draining (``drain()``, SIGTERM from the CLI): heartbeats say so, the router routes nothing new here, and the
worker keeps serving whatever still arrives (routes handed out just before the router knew) until it has been
idle for ``drain_quiet_s``, then exits. Past ``drain_timeout_s`` it exits anyway: the frontend migrates what
is left. A worker also waits ``drain_transfer_grace_s`` after its last prefill for a remote decode, the time a
decode worker has to pull that KV (a pull that still fails is recomputed, not lost).

Roles (docs/architecture.md#roles): a switchable worker takes the role a router forwards it (``set_role``) and
tells every router in its heartbeats; its engine serves either kind of request, so nothing there changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace

import structlog
import zmq
import zmq.asyncio

from common.addresses import advertised_endpoint
from common.errors import EngineError, ProtocolError
from common.outbox import PeerOutbox, PeerStalled
from common.protocol import (
    PROTOCOL_VERSION,
    Abort,
    ErrorReply,
    Generate,
    GetStats,
    Heartbeat,
    LoadAdapter,
    Message,
    RegisterWorker,
    Role,
    RoleSet,
    SetRole,
    UnloadAdapter,
    Unregister,
    WorkerInfo,
    WorkerLoad,
)
from common.router_link import EventsSocket, RouterLink, first_registration, send_all, split_endpoints
from common.transport import Server, new_id, open_context
from services.worker.adapters import change_adapter
from services.worker.config import WorkerConfig
from services.worker.engine import Engine, EngineCounters, EngineOutput, EngineRequest, worker_info, worker_stats
from services.worker.kv_events import KvEventPublisher
from services.worker.leases import HELD_PREFILL_S, Leases
from services.worker.lifecycle import drain_quiet_s, drained, role_refusal
from services.worker.metrics import WorkerMetrics
from services.worker.outputs import OutputForwarder
from services.worker.tier_load_log import NewTierLoads
from services.worker.trace_phases import RequestTrace
from services.worker.transfer_sources import TransferSources

log = structlog.get_logger(__name__)

class EngineDied(EngineError):
    """The worker's engine can serve nothing more; ``WorkerService.run()`` ends with it (the CLI exits 3)."""


class WorkerService:
    def __init__(self, config: WorkerConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        self.endpoint = ""
        self._server: Server | None = None
        # One link per router of the --router list (replicas): each gets our registration, heartbeats, events.
        self._links: list[RouterLink] = []
        self._events_socket: EventsSocket | None = None
        # Random per process: a restarted worker keeps its id, not this (frontends exclude the dead process).
        self.instance_id = new_id("wi")
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # Which frontend connection (ROUTER identity) sent each running request: only it may abort it.
        self._owners: dict[str, bytes] = {}
        self._held: Leases[bytes] = Leases()  # and each finished prefill's, while its KV may wait for a decode
        self._draining = False
        self._serving = False
        self._heartbeat_seq = 0
        self._report_soon = asyncio.Event()  # a request ended: the next beat comes early (_heartbeat_loop)
        self._drained = asyncio.Event()
        # Set once the engine can serve nothing more (engine.dead_reason()): the worker deregisters and exits.
        self._engine_dead = asyncio.Event()
        self.dead_reason = ""
        self._last_arrival_s = 0.0  # monotonic
        # Engines with a prefix cache that reports its changes publish KV events; others don't.
        self._events = (KvEventPublisher(config.worker_id, engine)  # type: ignore[arg-type]
                        if hasattr(engine, "drain_kv_events") else None)
        self._ctx: zmq.asyncio.Context | None = None
        # The role now: the CLI's at start, then what SetRole made it. We are its source of truth for every router.
        self._role: Role = config.role
        self._last_prefill_s = float("-inf")  # monotonic: when a prefill for a remote decode last finished here
        # Engines that only simulate their KV moves (mock) say so: their bytes are exported apart from wire bytes.
        self.transfers_simulated = bool(getattr(engine, "simulated_transfers", False))
        self.metrics = WorkerMetrics(config.worker_id, config.role, simulated_transfers=self.transfers_simulated)
        # Transfers not yet reported to the router, and where each came from (pulls) or went to (pushes).
        self._transfer_sources = TransferSources(config.worker_id)
        self._new_tier_loads = NewTierLoads()  # tier loads reported once each, by heartbeat

    async def run(self, ready: asyncio.Event | None = None) -> None:
        secure = open_context(self.config.transport)
        ctx = self._ctx = secure.ctx
        # Our high-water mark bounds what libzmq holds for a frontend that stopped reading (the outbox the rest).
        self._server = Server(ctx, self.config.endpoint,
                              replace(self.config.transport, hwm=self.config.outbox.socket_frames), mandatory=True)
        self._outbox = PeerOutbox(self._server, self._undelivered, self.config.outbox)
        self.endpoint = advertised_endpoint(self._server.endpoint, self.config.advertise_endpoint)
        self._events_socket = EventsSocket(ctx, self.config.transport)
        if self._events is not None:
            self._events.attach(self._events_socket)
        self._links = [
            RouterLink(ctx, endpoint, self.config.transport, source_id=self.config.worker_id,
                       make_registration=lambda rid: RegisterWorker(request_id=rid, info=self._info(),
                                                                    protocol_version=PROTOCOL_VERSION),
                       make_snapshot=self._events.snapshot if self._events is not None else None,
                       on_events_endpoint=self._events_socket.connect if self._events is not None else None,
                       on_set_role=self.set_role,
                       register_timeout_s=self.config.register_timeout_s)
            for endpoint in split_endpoints(self.config.router_endpoint)]
        background: list[asyncio.Task[None]] = []
        try:
            await self.engine.start()
            loop = asyncio.get_running_loop()
            background += (registering := [loop.create_task(link.keep_registered()) for link in self._links])
            await first_registration(self._links, registering)
            if self.config.metrics_port:
                self.metrics.serve(self.config.metrics_port, self.config.metrics_host)
            background.append(loop.create_task(self._heartbeat_loop()))
            if self._events is not None:
                background.append(loop.create_task(self._events.run()))
            log.info("worker_ready", worker_id=self.config.worker_id, role=self.config.role,
                     endpoint=self.endpoint, num_blocks=self.engine.num_blocks)
            if ready is not None:
                ready.set()
            self._serving = True
            serve = loop.create_task(self._serve())
            drained = loop.create_task(self._drained.wait())
            dead = loop.create_task(self._engine_dead.wait())
            background += [serve, drained, dead]
            await asyncio.wait({serve, drained, dead}, return_when=asyncio.FIRST_COMPLETED)
            if serve.done():
                serve.result()  # the serving loop's failure is ours
            if dead.done():
                # Replies to what is in flight go first (worker_lost: the frontend migrates each request).
                await asyncio.sleep(0)
                raise EngineDied(self.dead_reason)
        finally:
            for task in [*background, *self._tasks.values()]:
                task.cancel()
            send_all(self._links, Unregister(worker_id=self.config.worker_id))  # a dead router expires us instead
            await self.engine.shutdown()
            self._events_socket.close()
            for link in self._links:
                await link.close()
            self._outbox.flush()  # what is queued goes (a full peer's remainder is dropped with the socket)
            self._server.close()
            secure.close()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def role(self) -> Role:
        return self._role

    def set_role(self, msg: SetRole) -> RoleSet:
        """A router forwards a ``SetRole``: serve the new role from now on and tell every router.

        Nothing in the engine changes: it serves both kinds of request (``prefill_only`` and ``kv_transfer`` say
        which), so the old role's requests finish here as they are, a finished prefill's blocks stay until the
        decode side pulled them, and new work of the new role is served at once. The role changes where routers
        send work (their pools follow our heartbeats), our metrics' labels and registration."""
        refused = role_refusal(msg.role, self.config.switchable, self._draining)
        if refused:
            log.warning("role_refused", worker_id=self.config.worker_id, role=msg.role, reason=refused)
            return RoleSet(request_id=msg.request_id, worker_id=self.config.worker_id, role=self._role, ok=False,
                           reason=refused)
        if msg.role != self._role:
            log.info("role_set", worker_id=self.config.worker_id, old_role=self._role, role=msg.role,
                     num_requests=len(self._tasks), reason=msg.reason)
            self._role = msg.role
            self.metrics.set_role(msg.role)
            self._send_heartbeat()  # every router moves us now, not at the next beat (this one's before the answer)
        return RoleSet(request_id=msg.request_id, worker_id=self.config.worker_id, role=self._role, ok=True)

    def drain(self) -> None:
        """Stop taking new work, finish what is here, then return from ``run()``. Idempotent."""
        if self._draining:
            return
        self._draining = True
        if not self._serving:  # still starting: nothing to finish, stop as soon as start-up returns
            log.info("drain_started", worker_id=self.config.worker_id, num_requests=0)
            self._drained.set()
            return
        load = self.engine.load()
        log.info("drain_started", worker_id=self.config.worker_id, num_requests=len(self._tasks),
                 num_running=load.num_running, num_waiting=load.num_waiting, timeout_s=self.config.drain_timeout_s)
        self._send_heartbeat()  # tell the router now, not at the next beat
        asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        cfg = self.config
        start_s = time.monotonic()
        # The router learns we drain from a heartbeat; until a beat after that, it may still route here.
        await asyncio.sleep(2 * cfg.heartbeat_interval_s)
        quiet_s = drain_quiet_s(self._role, cfg.drain_quiet_s, cfg.drain_transfer_grace_s)
        while time.monotonic() - start_s < cfg.drain_timeout_s:
            if drained(len(self._tasks), self.engine.load(), time.monotonic(), self._last_arrival_s,
                       self._last_prefill_s, quiet_s, cfg.drain_transfer_grace_s):
                log.info("drained", worker_id=cfg.worker_id, drain_s=round(time.monotonic() - start_s, 3))
                break
            await asyncio.sleep(0.05)
        else:
            log.warning("drain_timeout", worker_id=cfg.worker_id, num_requests=len(self._tasks),
                        timeout_s=cfg.drain_timeout_s)
        self._drained.set()

    async def _serve(self) -> None:
        assert self._server is not None
        while True:
            identity, msg = await self._server.recv()
            try:
                self._dispatch(identity, msg)
            except ProtocolError as exc:
                log.warning("dropped_message", reason=str(exc))

    def _dispatch(self, identity: bytes, msg: Message) -> None:
        assert self._server is not None
        match msg:
            case Generate(request_id=rid):
                self._last_arrival_s = time.monotonic()
                if self._engine_is_dead():  # routed here before the router heard: the frontend migrates it
                    self._reply(identity, ErrorReply(request_id=rid, code="worker_lost",
                                                     message=f"worker {self.config.worker_id}: {self.dead_reason}"))
                    return
                if rid in self._tasks:
                    self._reply(identity, ErrorReply(request_id=rid, code="duplicate_request",
                                                           message=f"request {rid} is already running"))
                    return
                self._owners[rid] = identity
                self._tasks[rid] = asyncio.get_running_loop().create_task(self._generate(identity, msg))
            case Abort(request_id=rid):
                # Its frontend may stop a running request, or let a finished prefill's KV go (no decode comes).
                owner = self._owners.get(rid) if rid in self._tasks else self._held.take(rid, time.monotonic(), identity)
                if owner == identity:
                    asyncio.get_running_loop().create_task(self.engine.abort(rid))
                elif owner is not None:  # another frontend's request: not this peer's to cancel
                    log.warning("abort_refused", request_id=rid, reason="not the requester")
            case GetStats(request_id=rid):
                c = self._refresh_counters()
                self._reply(identity, worker_stats(rid, self.config.worker_id, self.engine.load(), c,
                                                   self._transfer_sources.named(c.recent_transfers),
                                                   self.transfers_simulated))
            case LoadAdapter() | UnloadAdapter():
                asyncio.get_running_loop().create_task(self._change_adapter(identity, msg))
            case _:
                raise ProtocolError(f"worker does not handle {type(msg).__name__}")

    async def _change_adapter(self, identity: bytes, msg: LoadAdapter | UnloadAdapter) -> None:
        self._reply(identity, await change_adapter(self.engine, msg, self.config.worker_id))
        self._send_heartbeat()  # routers learn the adapter now, not a beat later

    async def _generate(self, identity: bytes, msg: Generate) -> None:
        assert self._server is not None
        # Every log line of this request, in this task, carries its id (the frontend's, the same in every process).
        structlog.contextvars.bind_contextvars(request_id=msg.request_id)
        request = EngineRequest.of(msg)
        if request.kv_transfer is not None:
            self._transfer_sources.started(msg.request_id, request.kv_transfer.remote_engine_id)
        # "prefill": the prompt only, for a decode worker elsewhere; "generate": the whole request (its KV
        # pulled or pushed from a prefill worker when the hand-off says where, else prefilled here).
        kind = "prefill" if msg.prefill_only else "generate"
        trace = RequestTrace(msg, self.transfers_simulated)
        outcome = "lost"

        def seen(out: EngineOutput) -> None:
            trace.seen(out)
            self._transfer_sources.finished(msg.request_id)

        fwd = OutputForwarder(identity, self._outbox, seen)
        try:
            async for out in self.engine.generate(request, fwd.take):  # what the engine could not hand to take
                await fwd.put(out)
            if fwd.finish_reason is not None:
                outcome = "finished"
        except PeerStalled as exc:
            # That frontend read nothing for the stall timeout: stop computing for it, free the KV blocks.
            outcome = "failed"
            log.warning("requester_stalled", request_id=msg.request_id, error=str(exc),
                        num_dropped=self._outbox.drop(identity, msg.request_id))
            await self.engine.abort(msg.request_id)
            self._reply(identity, ErrorReply(request_id=msg.request_id, code="requester_stalled", message=str(exc)))
        except Exception as exc:
            if self._engine_is_dead():
                # Not this request's fault: the frontend moves it to another worker (or this one's successor).
                log.warning("request_lost_with_engine", request_id=msg.request_id, error=repr(exc))
                self._reply(identity, ErrorReply(request_id=msg.request_id, code="worker_lost",
                                                 message=f"worker {self.config.worker_id}: {self.dead_reason}"))
            elif isinstance(exc, EngineError):
                outcome = "failed"
                log.warning("request_failed", request_id=msg.request_id, error=str(exc))
                self._reply(identity, ErrorReply(request_id=msg.request_id, code="engine_error", message=str(exc)))
            else:  # never leave the frontend waiting on a request we lost
                outcome = "failed"
                log.exception("request_crashed", request_id=msg.request_id)
                self._reply(identity, ErrorReply(request_id=msg.request_id, code="internal_error",
                                                 message=repr(exc)))
                await self.engine.abort(msg.request_id)
        except asyncio.CancelledError:
            outcome = "cancelled"
            await self.engine.abort(msg.request_id)
            raise
        finally:
            if msg.prefill_only:
                self._last_prefill_s = time.monotonic()
                if outcome == "finished":  # its KV may be held for a decode: its frontend may let it go
                    self._held.hold(msg.request_id, identity, self._last_prefill_s, HELD_PREFILL_S)
            trace.done(self.config.worker_id, outcome)
            # One line a request at info: where each prompt was prefilled is visible on the worker itself.
            log.info("request_done", kind=kind, outcome=outcome, finish_reason=fwd.finish_reason,
                     num_prompt_tokens=len(msg.token_ids), num_cached_tokens=fwd.num_cached_tokens,
                     num_output_tokens=fwd.num_output_tokens,
                     kv_transfer=request.kv_transfer.mode if request.kv_transfer is not None else "",
                     duration_ms=round((time.monotonic() - trace.arrival_s) * 1000, 1))
            self.metrics.request_done(kind, outcome, len(msg.token_ids))
            self._tasks.pop(msg.request_id, None)
            self._owners.pop(msg.request_id, None)
            self._transfer_sources.finished(msg.request_id)
            self._report_soon.set()

    def _reply(self, identity: bytes, reply: Message) -> None:
        """A one-off reply, through the outbox so it follows the tokens sent before it."""
        self._outbox.put(identity, reply)

    def _undelivered(self, identity: bytes, msgs: list[Message], gone: bool) -> None:
        """The outbox could not send ``msgs`` to ``identity``: stop those requests (nobody reads them)."""
        for rid in dict.fromkeys(getattr(m, "request_id", "") for m in msgs):
            task = self._tasks.get(rid)
            if task is None or self._owners.get(rid) != identity:
                continue  # finished already (the engine has let it go) or not this peer's
            if gone:
                # The frontend that asked is gone (crashed or restarted): nobody will read these tokens.
                log.warning("requester_gone", request_id=rid)
            else:
                self._outbox.put(identity, ErrorReply(request_id=rid, code="internal_error",
                                                      message="a reply could not be sent"))
            task.cancel()  # its CancelledError handler aborts the engine request

    def _refresh_counters(self, load: WorkerLoad | None = None) -> EngineCounters:
        """Fresh engine counters, fed to the metrics (``counters()`` hands each transfer's seconds out once)."""
        counters = self.engine.counters()
        self.metrics.observe(load or self.engine.load(), counters)
        return counters

    def _info(self) -> WorkerInfo:
        return worker_info(self.config, self.engine, self._role, self.endpoint, self.instance_id,
                           kv_events=self._events is not None)

    async def _heartbeat_loop(self) -> None:
        """A beat every heartbeat_interval_s, and early_report_gap_s after a request ends: routers count what they
        routed here since a beat as queued, so a lone client's next prompt looked queued behind its last one."""
        while not self._engine_is_dead():
            self._send_heartbeat()
            self._report_soon.clear()
            await asyncio.sleep(gap_s := self.config.early_report_gap_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._report_soon.wait(), self.config.heartbeat_interval_s - gap_s)

    def _engine_is_dead(self) -> bool:
        """Asks the engine; the first time it says it is dead: deregister from every router at once (routing
        moves away now, not after the heartbeat timeout) and end ``run()``, so the process exits and its
        supervisor starts a fresh engine."""
        if self._engine_dead.is_set():
            return True
        reason = self.engine.dead_reason()
        if not reason:
            return False
        self.dead_reason = reason
        log.error("engine_dead", worker_id=self.config.worker_id, reason=reason, num_requests=len(self._tasks))
        send_all(self._links, Unregister(worker_id=self.config.worker_id))
        self._engine_dead.set()
        return True

    def _send_heartbeat(self) -> None:
        self._heartbeat_seq += 1
        load = self.engine.load()
        counters = self._refresh_counters(load)
        transfers = self._transfer_sources.new_samples(counters.recent_transfers)
        tier_loads = self._new_tier_loads.take(counters.recent_tier_loads)
        # One beat for every router (the pulls it reports are handed out once): a router that is down misses it.
        send_all(self._links, Heartbeat(worker_id=self.config.worker_id, load=load, seq=self._heartbeat_seq,
                                        draining=self._draining, transfers=transfers, role=self._role,
                                        tier_loads=tier_loads, lora_names=self.engine.lora_names()))
