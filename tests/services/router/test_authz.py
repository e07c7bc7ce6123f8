"""authorize: who may send each router message, by connection identity and CURVE key kind (a table per kind)."""

from __future__ import annotations

import pytest

from common.errors import ProtocolError
from common.protocol import (
    PROTOCOL_VERSION,
    Heartbeat,
    KvEvents,
    KvSnapshot,
    ListWorkers,
    RegisterTier,
    RegisterWorker,
    RoleSet,
    RouteRequest,
    SetRole,
    TierStats,
    Unregister,
    WorkerInfo,
    WorkerLoad,
)
from services.router.authz import Bindings, Decision, RefusalLog, Sender, authorize

INFO = WorkerInfo(worker_id="w0", role="both", model="m", block_size=4, num_blocks=8, endpoint="tcp://127.0.0.1:1")
# w0 registered from connection b"c-w0" with the worker key "K-worker"; kvtier-0 from b"c-t" with "K-kvtier".
BOUND = Bindings(identities={"w0": b"c-w0", "kvtier-0": b"c-t"}, keys={"w0": "K-worker", "kvtier-0": "K-kvtier"})
UNKEYED = Bindings(identities={"w0": b"c-w0"}, keys={"w0": ""})


def _keyed(kind: str, identity: bytes = b"c-other") -> Sender:
    return Sender(identity, f"K-{kind}", kind)


W0 = Sender(b"c-w0", "K-worker", "worker")  # the worker itself
TIER = Sender(b"c-t", "K-kvtier", "kvtier")
# Another worker: a valid worker key (all workers share one) on another connection.
OTHER_WORKER = _keyed("worker")
# The same connection id as w0's (a DEALER may choose its identity) but the frontend's key.
FRONTEND_AS_W0 = Sender(b"c-w0", "K-frontend", "frontend")

MESSAGES = {
    "route": RouteRequest(request_id="q", model="m", token_ids=(1, 2)),
    "list": ListWorkers(request_id="l"),
    "register": RegisterWorker(request_id="r", info=INFO, protocol_version=PROTOCOL_VERSION),
    "register_tier": RegisterTier(request_id="r", tier_id="kvtier-0", endpoint="tcp://127.0.0.1:5",
                                  protocol_version=PROTOCOL_VERSION),
    "heartbeat": Heartbeat(worker_id="w0", load=WorkerLoad()),
    "tier_heartbeat": Heartbeat(worker_id="kvtier-0", load=WorkerLoad()),
    "unregister": Unregister(worker_id="w0"),
    "snapshot": KvSnapshot(request_id="s", worker_id="w0", epoch=1, event_id=0, tier_blocks=()),
    "tier_snapshot": KvSnapshot(request_id="s", worker_id="kvtier-0", epoch=1, event_id=0, tier_blocks=()),
    "role_set": RoleSet(request_id="x", worker_id="w0", role="decode", ok=True),
    "events": KvEvents(worker_id="w0", epoch=1, event_id=1, events=()),
    "set_role": SetRole(request_id="x", worker_id="w0", role="decode"),
}

# (message, sender, allowed): every message kind against every key kind, with CURVE on.
TABLE = [
    ("route", _keyed("frontend"), True),
    ("route", _keyed("worker"), False),
    ("route", _keyed("planner"), False),
    ("list", _keyed("frontend"), True),
    ("list", _keyed("planner"), True),
    ("list", _keyed("worker"), True),
    ("register", _keyed("worker", b"c-new"), True),  # a restarted w0 (same key, new connection)
    ("register", _keyed("frontend"), False),
    ("register", _keyed("planner"), False),
    ("register", _keyed("kvtier"), False),
    ("register_tier", _keyed("kvtier", b"c-new"), True),
    ("register_tier", _keyed("worker"), False),
    ("register_tier", _keyed("frontend"), False),
    ("heartbeat", W0, True),
    ("heartbeat", OTHER_WORKER, False),
    ("heartbeat", FRONTEND_AS_W0, False),
    ("heartbeat", _keyed("planner", b"c-w0"), False),
    ("tier_heartbeat", TIER, True),
    ("tier_heartbeat", Sender(b"c-t", "K-worker", "worker"), False),  # a worker key on the tier's connection id
    ("tier_heartbeat", W0, False),
    ("unregister", W0, True),
    ("unregister", OTHER_WORKER, False),
    ("unregister", FRONTEND_AS_W0, False),
    ("unregister", _keyed("frontend"), False),
    ("unregister", _keyed("planner", b"c-w0"), False),
    ("snapshot", W0, True),
    ("snapshot", OTHER_WORKER, False),
    ("snapshot", FRONTEND_AS_W0, False),
    ("tier_snapshot", TIER, True),
    ("tier_snapshot", _keyed("kvtier"), False),
    ("role_set", W0, True),
    ("role_set", OTHER_WORKER, False),
    ("role_set", FRONTEND_AS_W0, False),
    ("events", Sender(b"", "K-worker", "worker"), True),  # SUB socket: no identity, the key decides
    ("events", Sender(b"", "K-frontend", "frontend"), False),
    ("events", Sender(b"", "K-kvtier", "kvtier"), False),  # the tier's key speaking for w0
    ("set_role", _keyed("planner"), True),
    ("set_role", _keyed("frontend"), False),
    ("set_role", _keyed("worker"), False),
    ("set_role", _keyed("kvtier"), False),
    ("set_role", Sender(b"c", "K-unknown", "?"), False),  # a key ZAP admitted that no kind names
]


@pytest.mark.parametrize(("name", "sender", "allowed"), TABLE)
def test_curve_grants_by_key_kind_and_binding(name: str, sender: Sender, allowed: bool) -> None:
    decision = authorize(MESSAGES[name], sender, BOUND)
    assert decision.allowed is allowed, decision.reason
    assert allowed or decision.reason


def test_a_registration_under_another_key_than_the_first_is_refused() -> None:
    bound = Bindings(identities={"w0": b"c-w0"}, keys={"w0": "K-worker-a"})
    decision = authorize(MESSAGES["register"], Sender(b"c2", "K-worker-b", "worker"), bound)
    assert not decision.allowed and decision.reason == "registered with another key"


# Without CURVE (the loopback default) no key kinds: only the connection a source registered from may speak for it.
UNKEYED_TABLE = [
    ("route", Sender(b"anyone"), True),
    ("set_role", Sender(b"anyone"), True),
    ("register", Sender(b"c-new"), True),
    ("heartbeat", Sender(b"c-w0"), True),
    ("heartbeat", Sender(b"c-other"), False),
    ("unregister", Sender(b"c-w0"), True),
    ("unregister", Sender(b"c-other"), False),
    ("snapshot", Sender(b"c-other"), False),
    ("role_set", Sender(b"c-other"), False),
    ("events", Sender(b""), True),  # nothing to tell publishers apart by: documented in docs/security.md
]


@pytest.mark.parametrize(("name", "sender", "allowed"), UNKEYED_TABLE)
def test_without_curve_the_connection_identity_decides(name: str, sender: Sender, allowed: bool) -> None:
    assert authorize(MESSAGES[name], sender, UNKEYED).allowed is allowed


def test_a_heartbeat_from_a_new_connection_with_the_right_key_asks_to_register_again() -> None:
    # A reconnect gets a fresh routing id: answered not_registered, so the worker rebinds by registering.
    moved = authorize(MESSAGES["heartbeat"], Sender(b"c-new", "K-worker", "worker"), BOUND)
    assert moved == Decision(False, "not the connection it registered from", reregister=True)
    # A heartbeat of an unknown worker is allowed: the router answers not_registered (it restarted).
    assert authorize(Heartbeat(worker_id="new", load=WorkerLoad()), OTHER_WORKER, BOUND).allowed
    # Other messages from a new connection: refused without that answer.
    assert not authorize(MESSAGES["unregister"], Sender(b"c-new", "K-worker", "worker"), BOUND).reregister


def test_messages_about_an_unregistered_source_are_refused_quietly() -> None:
    # A dropped worker's late snapshot or events: refused without a log or a count (nobody to protect).
    for name in ("snapshot", "events", "unregister", "role_set"):
        decision = authorize(MESSAGES[name], W0, Bindings({}, {}))
        assert not decision.allowed and decision.quiet, name


def test_a_message_the_router_does_not_take_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="TierStats"):
        authorize(TierStats(request_id="s", tier_id="t", block_bytes=1, host_slots=1, host_used=0), W0, BOUND)


def test_refusals_are_logged_once_per_sender_and_kind_then_rate_limited() -> None:
    log = RefusalLog(every_s=60.0)
    refused = Decision(False, "x")
    unreg, beat = MESSAGES["unregister"], MESSAGES["heartbeat"]
    assert log.refused(OTHER_WORKER, unreg, refused, 0.0)
    assert not log.refused(OTHER_WORKER, unreg, refused, 1.0)
    assert log.refused(OTHER_WORKER, beat, refused, 1.0)  # another kind: logged
    assert log.refused(FRONTEND_AS_W0, unreg, refused, 1.0)  # another sender: logged
    assert log.refused(OTHER_WORKER, unreg, refused, 61.0)  # a minute later: logged again


def test_the_refusal_table_is_bounded() -> None:
    log = RefusalLog(max_senders=3)
    for i in range(10):  # a peer cycling identities
        log.refused(Sender(bytes([i])), MESSAGES["unregister"], Decision(False, "x"), 0.0)
    assert len(log._seen) <= 3
