"""Who may say what to the router: every message about a worker or a tier only from the peer that registered it.

A peer is known by two things (``Sender``): its routing identity on the router's ROUTER socket (one per connection,
assigned by ZeroMQ) and, with CURVE on, the public key its handshake proved (ZAP's ``User-Id``, z85) and that key's
kind (the ``clients/<kind>.key`` file it matches: frontend, worker, kvtier, planner). A worker or tier is bound to
the identity and key it registered from (``Bindings``); what it says later must come from both.

Without CURVE there is no key: only the identity binding holds, which stops a confused or stale peer but not a
hostile one (a DEALER may pick its own identity, and ROUTER_HANDOVER gives it the route). That is the loopback
default, where every local process is trusted anyway. With CURVE a liar holding another service's valid key is
refused by kind, and one holding a worker key (all workers share one) cannot take another worker's route, because
the key is checked on every message, not only at registration.

``authorize`` is pure: the router asks it before handling each message and drops what it refuses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from common.errors import ProtocolError
from common.protocol import (
    ErrorReply,
    Heartbeat,
    KvEvents,
    KvSnapshot,
    ListWorkers,
    Message,
    RegisterTier,
    RegisterWorker,
    RoleSet,
    RouteRequest,
    SetRole,
    Unregister,
)

log = structlog.get_logger(__name__)

# Key kinds (``clients/<kind>.key`` of ``splitserve keys make``) allowed to send each message; "" (no CURVE): any.
ROUTE_KINDS = ("frontend",)
WORKER_KINDS = ("worker",)
TIER_KINDS = ("kvtier",)
SOURCE_KINDS = ("worker", "kvtier")  # KV sources: heartbeats, snapshots, events
OPERATOR_KINDS = ("planner",)  # the planner and the operator's CLI (`splitserve roles set` uses the planner key)
READ_KINDS = ("frontend", "worker", "kvtier", "planner", "scaler")


@dataclass(frozen=True, slots=True)
class Sender:
    identity: bytes  # routing id on the ROUTER socket; b"" on the events SUB socket (PUB/SUB carries none)
    key: str = ""  # z85 CURVE public key; "" without CURVE
    kind: str = ""  # that key's kind; "" without CURVE (or "?" for a key ZAP admitted but no kind names)


@dataclass(frozen=True, slots=True)
class Bindings:
    """Live views of the router's tables: source id (worker or tier) -> identity and key it registered from."""

    identities: Mapping[str, bytes]
    keys: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str = ""
    # Refused, but answered ``not_registered``: a source whose connection came back under a new routing id (same
    # key) registers again and binds the new one. Only a peer that could register anyway gets this answer.
    reregister: bool = False
    # Refused as about a source not (or no longer) registered: a dropped worker's late message, nobody to
    # protect; dropped without a log or a count.
    quiet: bool = False


ALLOW = Decision(True)


def _kind_ok(sender: Sender, kinds: tuple[str, ...]) -> bool:
    return sender.key == "" or sender.kind in kinds


def _bound(source_id: str, sender: Sender, bindings: Bindings, *, events: bool = False) -> Decision:
    """Is ``sender`` the peer ``source_id`` registered from? ``events``: the SUB socket, key only."""
    identity = bindings.identities.get(source_id)
    if identity is None:
        return Decision(False, "not registered", quiet=True)
    key = bindings.keys.get(source_id, "")
    if key != sender.key:
        return Decision(False, "not the key it registered with")
    if not events and identity != sender.identity:
        return Decision(False, "not the connection it registered from", reregister=True)
    return ALLOW


def _registration(source_id: str, sender: Sender, bindings: Bindings, kinds: tuple[str, ...]) -> Decision:
    if not _kind_ok(sender, kinds):
        return Decision(False, f"a {sender.kind} key may not register a {'/'.join(kinds)}")
    # A restart or reconnect registers again from a new identity; with CURVE only with the key it had.
    key = bindings.keys.get(source_id)
    if key is not None and source_id in bindings.identities and key != sender.key:
        return Decision(False, "registered with another key")
    return ALLOW


def authorize(msg: Message, sender: Sender, bindings: Bindings) -> Decision:
    """May ``sender`` send ``msg`` to the router now?"""
    match msg:
        case RouteRequest():
            return ALLOW if _kind_ok(sender, ROUTE_KINDS) else Decision(False, f"a {sender.kind} key may not route")
        case ListWorkers():
            return ALLOW if _kind_ok(sender, READ_KINDS) else Decision(False, f"a {sender.kind} key may not list")
        case RegisterWorker(info=info):
            return _registration(info.worker_id, sender, bindings, WORKER_KINDS)
        case RegisterTier(tier_id=tier_id):
            return _registration(tier_id, sender, bindings, TIER_KINDS)
        case Heartbeat(worker_id=source_id):
            if not _kind_ok(sender, SOURCE_KINDS):
                return Decision(False, f"a {sender.kind} key may not heartbeat")
            if source_id not in bindings.identities:
                return ALLOW  # answered not_registered: a restarted router asks the worker to register again
            return _bound(source_id, sender, bindings)
        case Unregister(worker_id=source_id):
            if not _kind_ok(sender, WORKER_KINDS):
                return Decision(False, f"a {sender.kind} key may not unregister a worker")
            return _without_reregister(_bound(source_id, sender, bindings))
        case KvSnapshot(worker_id=source_id) | RoleSet(worker_id=source_id):
            kinds = SOURCE_KINDS if isinstance(msg, KvSnapshot) else WORKER_KINDS
            if not _kind_ok(sender, kinds):
                return Decision(False, f"a {sender.kind} key may not send {type(msg).__name__}")
            return _without_reregister(_bound(source_id, sender, bindings))
        case KvEvents(worker_id=source_id):
            if not _kind_ok(sender, SOURCE_KINDS):
                return Decision(False, f"a {sender.kind} key may not publish KV events")
            return _bound(source_id, sender, bindings, events=True)
        case SetRole():
            if not _kind_ok(sender, OPERATOR_KINDS):
                return Decision(False, f"a {sender.kind} key may not set roles")
            return ALLOW
        case _:
            raise ProtocolError(f"router does not handle {type(msg).__name__}")


def _without_reregister(decision: Decision) -> Decision:
    return Decision(decision.allowed, decision.reason, quiet=decision.quiet) if decision.reregister else decision


@dataclass(slots=True)
class _Seen:
    last_logged_s: float
    num_suppressed: int = 0


class RefusalLog:
    """Logs a refusal once per (sender, message kind), then at most once per ``every_s`` with the count since:
    a hostile peer cannot flood the log, and an operator still sees it keeps trying."""

    def __init__(self, every_s: float = 60.0, max_senders: int = 4096) -> None:
        self.every_s = every_s
        self.max_senders = max_senders  # bounds the table a peer cycling identities can grow
        self._seen: dict[tuple[str, str], _Seen] = {}

    def refused(self, sender: Sender, msg: Message, decision: Decision, now_s: float) -> bool:
        """Record one refusal; True when it was logged."""
        who = sender.key or sender.identity.hex()
        kind = type(msg).__name__
        seen = self._seen.get((who, kind))
        if seen is not None and now_s - seen.last_logged_s < self.every_s:
            seen.num_suppressed += 1
            return False
        if seen is None and len(self._seen) >= self.max_senders:
            self._seen.pop(next(iter(self._seen)))
        log.warning("message_refused", message=kind, about=getattr(msg, "worker_id", "") or getattr(msg, "tier_id", ""),
                    reason=decision.reason, sender_kind=sender.kind or "unkeyed", sender=who[:16],
                    num_suppressed=seen.num_suppressed if seen is not None else 0)
        self._seen[(who, kind)] = _Seen(now_s)
        return True


@dataclass
class Gate:
    """The router's use of ``authorize``: names the sender's key kind, and counts, logs (rate-limited) and drops
    what it refuses."""

    bindings: Bindings
    refused_counter: Any  # prometheus Counter labelled by message kind
    # Kind of each client key accepted (z85 -> frontend, worker, kvtier, planner); empty without CURVE.
    kinds: dict[str, str] = field(default_factory=dict)
    log: RefusalLog = field(default_factory=RefusalLog)

    def sender(self, identity: bytes, key: str) -> Sender:
        return Sender(identity, key, self.kinds.get(key, "?") if key else "")

    def check(self, identity: bytes, key: str, msg: Message, now_s: float) -> Message | bool:
        """True: handle it. False: dropped. A message: dropped, send this instead (the not_registered answer that
        makes a reconnected source register again)."""
        sender = self.sender(identity, key)
        decision = authorize(msg, sender, self.bindings)
        if decision.allowed:
            return True
        if decision.quiet:
            return False
        self.refused_counter.labels(type(msg).__name__).inc()
        self.log.refused(sender, msg, decision, now_s)
        if decision.reregister and isinstance(msg, Heartbeat):
            return ErrorReply(request_id=f"hb-{msg.worker_id}", code="not_registered", message=msg.worker_id)
        return False
