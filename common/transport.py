"""A small transport over ZeroMQ: ROUTER servers, DEALER clients, msgpack messages from common.protocol.

A ``Client`` is one DEALER connected to one server. It matches replies to requests by ``request_id``:
``request`` awaits one reply, ``open_stream`` yields every reply for a request id until the caller closes it.
A ``Server`` is one ROUTER: ``recv`` returns (peer identity, message) and ``send`` answers that peer.
Malformed frames and frames over ``max_message_bytes`` are logged and dropped; the connection they came on and
every stream multiplexed on it keep going. Only a frame over ``hard_max_message_bytes`` (16x the cap) makes libzmq
cut that peer's connection (ZMQ_MAXMSGSIZE: the bound on what one hostile peer can make us buffer). A message over
the cap is refused before it is sent (``ProtocolError``), so our own processes never trip a peer's limit.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import structlog
import zmq
import zmq.asyncio

from common import protocol
from common.errors import ProtocolError, RemoteError, TransportTimeout
from common.loop_socket import LoopSocket
from common.protocol import ErrorReply, Message
from common.security import CurveKeys, SecureContext, secure_client, secure_server
from common.stream_inbox import Coalesce, StreamInbox

log = structlog.get_logger(__name__)

# Largest message a socket accepts; larger frames are dropped (logged). A 128k-token request is ~0.6 MiB.
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# libzmq's own limit, over which it closes the connection, as a multiple of the cap above.
HARD_LIMIT_FACTOR = 16

# Messages a reader takes per wake-up straight from the socket (no asyncio future each) before it awaits
# again; bounds how long one burst keeps the loop.
_DRAIN_MAX = 256

def new_id(prefix: str) -> str:
    """A request id unique across processes, hosts and restarts: 96 random bits (``prefix-<24 hex>``).

    Ids made of a pid and a counter collide between replicas (every container's frontend is PID 1), and workers
    and routers key requests by id."""
    return f"{prefix}-{os.urandom(12).hex()}"


@dataclass(frozen=True, slots=True)
class TransportConfig:
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # Messages queued per socket before send blocks (ZeroMQ high-water mark).
    hwm: int = 100_000
    # CURVE keys for sockets that cross hosts; None = plain TCP (the loopback default).
    curve: CurveKeys | None = None

    def toward(self, server: str) -> TransportConfig:
        """This config for a client socket dialing a ``server`` kind (router, worker, kvtier): CURVE then
        checks that server's public key."""
        if self.curve is None:
            return self
        return replace(self, curve=self.curve.toward(server))

    @property
    def hard_max_message_bytes(self) -> int:
        return self.max_message_bytes * HARD_LIMIT_FACTOR


def encode_capped(msg: Message, max_message_bytes: int) -> bytes:
    """``protocol.encode``, refusing a message its peer would drop."""
    data = protocol.encode(msg)
    if len(data) > max_message_bytes:
        raise ProtocolError(f"{type(msg).__name__} of {len(data)} bytes is over the {max_message_bytes}-byte "
                            "message cap; not sent")
    return data


def oversized(data: bytes, max_message_bytes: int, **where: Any) -> bool:
    """True (and logged) when a received frame is over the cap: the caller drops it."""
    if len(data) <= max_message_bytes:
        return False
    log.warning("dropped_frame", reason="over the message cap", num_bytes=len(data), cap=max_message_bytes, **where)
    return True


def open_context(config: TransportConfig) -> SecureContext:
    """The process's ZeroMQ context (with CURVE client checks when configured); close it last."""
    return SecureContext(config.curve)


def _configure(sock: zmq.Socket, config: TransportConfig) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, config.hard_max_message_bytes)
    sock.setsockopt(zmq.SNDHWM, config.hwm)
    sock.setsockopt(zmq.RCVHWM, config.hwm)


def peer_key(frame: zmq.Frame) -> str:
    """The CURVE public key (z85) the ZAP handler proved for the connection ``frame`` came on; "" without one."""
    try:
        return frame.get("User-Id")
    except zmq.ZMQError:  # no ZAP handler on this socket: the property is absent
        return ""


class Server:
    """A ROUTER socket bound to ``endpoint``."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, config: TransportConfig = TransportConfig(),
                 mandatory: bool = False, read_keys: bool = False):
        self._sock = ctx.socket(zmq.ROUTER)
        # Keep each message's CURVE key (``recv_peer``): frames are then read zero-copy, to ask libzmq for the
        # connection's User-Id. Only with CURVE on: without it there is no key to read.
        self._read_keys = read_keys and config.curve is not None
        self._max_bytes = config.max_message_bytes
        _configure(self._sock, config)
        secure_server(self._sock, config.curve)
        # A peer that reconnects with the same identity takes over its route instead of being refused.
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if mandatory:
            # Sending to a peer that is gone raises EHOSTUNREACH instead of dropping silently (``deliver_nowait``
            # tells the caller, so a worker stops generating for a frontend that died); a full queue raises
            # zmq.Again instead of dropping.
            self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.bind(endpoint)
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        # Every operation goes through the loop-driven socket (common/loop_socket.py), never pyzmq's asyncio
        # layer, which checks ZMQ_EVENTS around each send and receive.
        self._loop_sock = LoopSocket(self._sock)
        self._pending: deque[list[bytes]] = deque()

    async def recv(self) -> tuple[bytes, Message]:
        """The next well-formed message; malformed ones are logged and skipped."""
        identity, _key, msg = await self.recv_peer()
        return identity, msg

    async def recv_peer(self) -> tuple[bytes, str, Message]:
        """``recv`` with the sender's CURVE key (z85; "" unless made with ``read_keys`` and CURVE on)."""
        copy = not self._read_keys
        while True:
            if self._pending:
                frames = self._pending.popleft()
            else:
                frames = await self._loop_sock.recv_multipart(copy=copy)
                self._loop_sock.drain(self._pending.append, _DRAIN_MAX, multipart=True, copy=copy)
            if len(frames) != 2:
                log.warning("dropped_frame", reason="expected identity + payload", num_frames=len(frames))
                continue
            key = ""
            if not copy:
                key = peer_key(frames[1])
                frames = [frames[0].bytes, frames[1].bytes]
            if oversized(frames[1], self._max_bytes, endpoint=self.endpoint):
                continue
            try:
                return frames[0], key, protocol.decode(frames[1])
            except ProtocolError as exc:
                log.warning("dropped_frame", reason=str(exc))

    async def send(self, identity: bytes, msg: Message) -> None:
        """Send, waiting while the peer's queue is full (a mandatory server's zmq.Again)."""
        await self._loop_sock.send_multipart((identity, encode_capped(msg, self._max_bytes)))

    def send_nowait(self, identity: bytes, msg: Message) -> None:
        """Send without awaiting; ROUTER never blocks (drops on a full queue), so this is safe on hot paths.
        An error (a mandatory server's EHOSTUNREACH or zmq.Again) is raised here. A send can consume the
        edge-triggered ZeroMQ fd's readable edge: the loop socket then re-checks for the pending receive."""
        self._loop_sock.send_multipart_nowait((identity, encode_capped(msg, self._max_bytes)))

    def deliver_nowait(self, identity: bytes, msg: Message) -> bool:
        """``send_nowait`` that answers False when the peer is gone (a ``mandatory`` server only; else always
        True). Raises zmq.Again on a full queue of a mandatory server: await ``send`` then."""
        try:
            self.send_nowait(identity, msg)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return False
            raise
        return True

    def close(self) -> None:
        self._loop_sock.close()
        self._sock.close(linger=0)


async def serve_requests(server: Server, handle: Callable[..., Message | None], name: str,
                         with_keys: bool = False) -> None:
    """Answer requests on ``server`` forever: ``handle(identity, msg)`` returns the reply (or None); with
    ``with_keys``, ``handle(identity, msg, key)`` (the sender's CURVE key, see ``Server.recv_peer``). A message the
    handler refuses (ProtocolError) is logged and dropped; one that crashes it gets an internal_error reply.
    Neither takes the service down."""
    while True:
        identity, key, msg = await server.recv_peer()
        try:
            reply = handle(identity, msg, key) if with_keys else handle(identity, msg)
        except ProtocolError as exc:
            log.warning("dropped_message", service=name, reason=str(exc))
            continue
        except Exception as exc:
            log.exception("handler_failed", service=name, message=type(msg).__name__)
            request_id = getattr(msg, "request_id", None)
            if request_id is None:
                continue
            reply = ErrorReply(request_id=request_id, code="internal_error", message=repr(exc))
        if reply is not None:
            server.send_nowait(identity, reply)


class Client:
    """A DEALER socket connected to one server, with request/reply and streams matched by request_id.

    ``on_unsolicited`` receives messages whose request_id nobody waits for (e.g. a router telling a worker
    it must register again).
    """

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        config: TransportConfig = TransportConfig(),
        on_unsolicited: Callable[[Message], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._sock = ctx.socket(zmq.DEALER)
        self._max_bytes = config.max_message_bytes
        _configure(self._sock, config)
        secure_client(self._sock, config.curve)
        self._sock.connect(endpoint)
        self._loop_sock = LoopSocket(self._sock)  # see Server
        self._waiters: dict[str, asyncio.Future[Message]] = {}
        self._streams: dict[str, StreamInbox] = {}
        self._on_unsolicited = on_unsolicited
        self._reader: asyncio.Task[None] | None = None
        self._closed = False
        self.num_send_failures = 0  # sends that failed (logged as send_failed)

    def start(self) -> None:
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    async def _read_loop(self) -> None:
        sock = self._loop_sock
        try:
            while True:
                self._on_frame(await sock.recv())
                sock.drain(self._on_frame, _DRAIN_MAX)
        except (asyncio.CancelledError, zmq.ContextTerminated):
            pass
        except Exception as exc:  # forward to everyone waiting, so nobody hangs on a dead reader
            log.error("client_reader_failed", endpoint=self.endpoint, error=repr(exc))
            for fut in self._waiters.values():
                if not fut.done():
                    fut.set_exception(exc)
            raise

    def _on_frame(self, data: bytes) -> None:
        if oversized(data, self._max_bytes, endpoint=self.endpoint):
            return
        try:
            msg = protocol.decode(data)
        except ProtocolError as exc:
            log.warning("dropped_frame", endpoint=self.endpoint, reason=str(exc))
            return
        if isinstance(msg, protocol.TokensBatch):  # several requests' tokens in one frame: each as if alone
            for item in msg.items:
                self._deliver(item)
            return
        self._deliver(msg)

    def _deliver(self, msg: Message) -> None:
        request_id = getattr(msg, "request_id", None)
        queue = self._streams.get(request_id) if request_id is not None else None
        if queue is not None:
            queue.put_nowait(msg)
            return
        fut = self._waiters.pop(request_id, None) if request_id is not None else None
        if fut is not None:
            if not fut.done():
                if isinstance(msg, ErrorReply):
                    fut.set_exception(RemoteError(msg.code, msg.message))
                else:
                    fut.set_result(msg)
            return
        if self._on_unsolicited is not None:
            self._on_unsolicited(msg)

    def send_nowait(self, msg: Message) -> None:
        """Send without awaiting. A failure is never left in a future nobody reads: it is logged and counted
        (``num_send_failures``) and, when ``msg`` belongs to an open stream, that stream gets ``worker_lost`` at
        once (its request fails over now, not at its idle timeout); else an immediate failure (zmq.Again: the
        queue to the peer is full, or there is no peer) is raised."""
        try:
            self._loop_sock.send_nowait(encode_capped(msg, self._max_bytes))
        except zmq.ZMQError as exc:
            if not self._send_failed(msg, exc):
                raise

    def _send_failed(self, msg: Message, exc: BaseException) -> bool:
        """Log and count a failed send; fail its stream if one is open (True then)."""
        self.num_send_failures += 1
        request_id = getattr(msg, "request_id", None)
        queue = self._streams.get(request_id) if request_id is not None else None
        log.warning("send_failed", endpoint=self.endpoint, message=type(msg).__name__, request_id=request_id,
                    error=str(exc) or type(exc).__name__, stream_failed=queue is not None)
        if queue is None:
            return False
        queue.put_nowait(ErrorReply(request_id=request_id, code="worker_lost",
                                    message=f"send to {self.endpoint} failed: {exc or type(exc).__name__}"))
        return True

    async def send(self, msg: Message) -> None:
        await self._loop_sock.send(encode_capped(msg, self._max_bytes))

    async def request(self, msg: Message, timeout_s: float) -> Message:
        """Send ``msg`` (which has a request_id) and await its one reply."""
        self.start()
        request_id = msg.request_id  # type: ignore[union-attr]
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = fut
        try:
            data = encode_capped(msg, self._max_bytes)
            try:
                self._loop_sock.send_nowait(data)
            except zmq.Again:
                # No peer to hand it to (a server that refused our CURVE handshake, a full queue to a stalled
                # one): a DEALER's send would wait forever, so it waits under the deadline too.
                await asyncio.wait_for(self._loop_sock.send(data), timeout_s)
            return await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError as exc:
            raise TransportTimeout(f"no reply from {self.endpoint} within {timeout_s}s") from exc
        finally:
            self._waiters.pop(request_id, None)

    def open_stream(self, request_id: str, coalesce: Coalesce | None = None) -> StreamInbox:
        """Every message for ``request_id`` lands in the returned inbox until ``close_stream``; ``coalesce`` may
        join one into the one queued before it (stream_inbox.py)."""
        self.start()
        inbox = self._streams[request_id] = StreamInbox(coalesce)
        return inbox

    def close_stream(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def fail_streams(self, exc: Exception) -> None:
        """Wake every open stream with an error message (the peer is gone)."""
        for request_id, queue in self._streams.items():
            queue.put_nowait(ErrorReply(request_id=request_id, code="worker_lost", message=str(exc)))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass
        self._loop_sock.close()
        self._sock.close(linger=0)

