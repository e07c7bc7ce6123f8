"""A KV source's ties to every router of its ``--router`` list: registration, heartbeats, snapshots, events.

Workers and kvtier register with, heartbeat to and publish their KV events to every router, so each router
replica holds the whole picture and any one of them can route (no single point of failure). One ``RouterLink``
per router: it registers until that router answers, heartbeats every ``interval_s``, registers again when a
restarted router says ``not_registered``, and answers its ``KvSnapshotRequest``s and the ``SetRole``s it
forwards. One ``EventsSocket`` (a PUB connected to every router's SUB, ``bind_events_subscriber``) carries the
numbered ``KvEvents`` to all of them at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
import zmq
import zmq.asyncio

from common.addresses import dialable
from common.backoff import Backoff
from common.errors import RegistrationRefused, RemoteError, TransportTimeout
from common.protocol import ErrorReply, KvSnapshot, KvSnapshotRequest, Message, RegisterAck, RoleSet, SetRole
from common.security import secure_client, secure_server
from common.transport import Client, TransportConfig, new_id

log = structlog.get_logger(__name__)


def split_endpoints(routers: str) -> tuple[str, ...]:
    """A ``--router`` value: one endpoint or several, comma-separated (router replicas)."""
    endpoints = tuple(e.strip() for e in routers.split(",") if e.strip())
    if not endpoints:
        raise ValueError(f"no router endpoint in {routers!r}")
    return endpoints


def bind_events_subscriber(ctx: zmq.asyncio.Context, config: TransportConfig, endpoint: str
                           ) -> tuple[zmq.asyncio.Socket, str]:
    """The router's end of every source's ``EventsSocket``: a SUB bound at ``endpoint``, and where it bound."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.MAXMSGSIZE, config.hard_max_message_bytes)
    sub.setsockopt(zmq.RCVHWM, config.hwm)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    secure_server(sub, config.curve)
    sub.bind(endpoint)
    return sub, sub.getsockopt_string(zmq.LAST_ENDPOINT)


class EventsSocket:
    """One PUB socket connected to each router's events endpoint; what it publishes reaches all of them."""

    def __init__(self, ctx: zmq.asyncio.Context, config: TransportConfig) -> None:
        self._ctx, self._config = ctx, config
        self._sock: zmq.asyncio.Socket | None = None
        self._plain: zmq.Socket | None = None  # the same socket, off pyzmq's asyncio layer
        self._endpoint_of: dict[str, str] = {}  # router endpoint -> its events endpoint we dialed

    def connect(self, router: str, events_endpoint: str) -> None:
        """Dial ``router``'s events endpoint (a restarted router may bind another: the old one is dropped)."""
        endpoint = dialable(events_endpoint, router)  # a wildcard: dial it where we reach the router
        if self._endpoint_of.get(router) == endpoint:
            return
        if self._sock is None:
            sock = self._sock = self._ctx.socket(zmq.PUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, self._config.hwm)
            secure_client(sock, self._config.toward("router").curve)
            # Sends through the plain socket: pyzmq's asyncio one makes a future per send (and would hold a
            # failed send's error in it, unread).
            self._plain = zmq.Socket.shadow(sock.underlying)
        old = self._endpoint_of.pop(router, None)
        if old is not None and old not in self._endpoint_of.values():
            try:
                self._sock.disconnect(old)
            except zmq.ZMQError:
                pass
        if endpoint not in self._endpoint_of.values():
            self._sock.connect(endpoint)
        self._endpoint_of[router] = endpoint

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def send(self, data: bytes) -> bool:
        """Publish without blocking; False when dropped (no router yet, or the queue is full)."""
        if self._sock is None or self._plain is None:
            return False
        try:
            self._plain.send(data, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = self._plain = None
        self._endpoint_of.clear()


class RouterLink:
    """One router: register (``make_registration`` gives the message, with a fresh request id), heartbeat,
    register again when it forgot us, answer its snapshot requests."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, config: TransportConfig, *, source_id: str,
                 make_registration: Callable[[str], Message],
                 make_snapshot: Callable[[str], KvSnapshot] | None = None,
                 on_events_endpoint: Callable[[str, str], None] | None = None,
                 on_set_role: Callable[[SetRole], RoleSet] | None = None,
                 register_timeout_s: float = 2.0) -> None:
        self.endpoint = endpoint
        self.source_id = source_id
        self._make_registration = make_registration
        self._make_snapshot = make_snapshot
        self._on_events_endpoint = on_events_endpoint
        self._on_set_role = on_set_role
        self._register_timeout_s = register_timeout_s
        self.client = Client(ctx, endpoint, config.toward("router"), on_unsolicited=self._on_message)
        self._must_register = asyncio.Event()
        self.registered = asyncio.Event()

    async def register(self) -> None:
        """Register until this router answers; a refusal is fatal (a broken contract never degrades)."""
        backoff = Backoff(base_s=0.1, max_s=2.0)
        while True:
            try:
                ack = await self.client.request(self._make_registration(new_id("reg")),
                                                timeout_s=self._register_timeout_s)
                assert isinstance(ack, RegisterAck)
                self._must_register.clear()
                if ack.events_endpoint and self._on_events_endpoint is not None:
                    self._on_events_endpoint(self.endpoint, ack.events_endpoint)
                log.info("registered", source_id=self.source_id, router=self.endpoint)
                self.registered.set()
                return
            except RemoteError as exc:
                if exc.code == "registration_refused":
                    log.error("registration_refused", source_id=self.source_id, router=self.endpoint,
                              reason=exc.message)
                    raise RegistrationRefused(exc.message) from exc
                log.warning("register_failed", router=self.endpoint, error=str(exc))
            except TransportTimeout:
                log.warning("router_unreachable", router=self.endpoint)
            await asyncio.sleep(backoff.next_s())

    async def keep_registered(self) -> None:
        """Register, then register again whenever this router says it forgot us (it restarted). The owner
        sends the same heartbeat to every registered link (``send_all``)."""
        await self.register()
        while True:
            await self._must_register.wait()
            log.warning("router_forgot_us", source_id=self.source_id, router=self.endpoint)
            await self.register()

    def send(self, msg: Message) -> None:
        """Fire and forget; a router that is down (our queue to it full) just misses this one."""
        try:
            self.client.send_nowait(msg)
        except zmq.Again:
            pass

    def _on_message(self, msg: Message) -> None:
        match msg:
            case ErrorReply(code="not_registered"):
                self._must_register.set()
            case KvSnapshotRequest(request_id=rid):
                if self._make_snapshot is not None:
                    self.send(self._make_snapshot(rid))
            case SetRole(request_id=rid):  # forwarded by this router: switch, then answer it
                self.send(self._on_set_role(msg) if self._on_set_role is not None else RoleSet(
                    request_id=rid, worker_id=msg.worker_id, role=msg.role, ok=False, reason="not a worker"))
            case _:
                log.warning("unexpected_router_message", router=self.endpoint, type=type(msg).__name__)

    async def close(self) -> None:
        await self.client.close()


def send_all(links: list[RouterLink], msg: Message) -> None:
    """``msg`` (a heartbeat, an unregister) to every router that has accepted us."""
    for link in links:
        if link.registered.is_set():
            link.send(msg)


async def first_registration(links: list[RouterLink], tasks: list[asyncio.Task[None]]) -> None:
    """Wait until any router accepted us; a refusal from any (its task failed) is raised here."""
    waits = [asyncio.ensure_future(link.registered.wait()) for link in links]
    try:
        done, _ = await asyncio.wait([*waits, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task in done:
                task.result()  # RegistrationRefused (or a crash) ends start-up loudly
    finally:
        for wait in waits:
            wait.cancel()
