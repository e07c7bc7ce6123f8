"""The launcher's answer to a ScaleRequest (pure) and its event socket."""

from __future__ import annotations

import time

import pytest
import zmq

from cli.scaling import PoolMember, ScaleActions, ScaleEvents, scale_actions
from common.protocol import RoleSet, ScaleRequest, encode

MEMBERS = [
    PoolMember("prefill-0", "prefill", started_s=1.0),
    PoolMember("decode-1", "decode", started_s=1.0),
    PoolMember("prefill-2", "prefill", started_s=5.0),
    PoolMember("prefill-3", "prefill", started_s=9.0, draining=True),
]


@pytest.mark.parametrize("role, target, max_total, expected", [
    ("prefill", 2, 8, ScaleActions()),  # the draining one does not count
    ("prefill", 4, 8, ScaleActions(start=2)),
    ("prefill", 4, 4, ScaleActions(start=1)),  # 3 live + 1 new = the budget
    ("prefill", 1, 8, ScaleActions(drain=("prefill-2",))),  # youngest first
    ("prefill", 0, 8, ScaleActions(drain=("prefill-2", "prefill-0"))),
    ("decode", 3, 8, ScaleActions(start=2)),
    ("decode", 1, 8, ScaleActions()),
])
def test_scale_actions(role, target, max_total, expected) -> None:
    assert scale_actions(MEMBERS, role, target, max_total) == expected


def test_scale_events_keep_the_latest_per_pool_and_drop_garbage() -> None:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    events = ScaleEvents(f"tcp://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 5
        got: dict[str, int] = {}
        while "decode" not in got and time.monotonic() < deadline:  # a SUB joins late: publish until seen
            pub.send(encode(ScaleRequest(seq=0, pool="decode", current=1, target=1)))
            time.sleep(0.02)
            got = events.poll()
        pub.send(b"\x93not a message")
        for seq, (pool, target) in enumerate([("prefill", 2), ("decode", 3), ("prefill", 3)], start=1):
            pub.send(encode(ScaleRequest(seq=seq, pool=pool, current=1, target=target)))
        seen: dict[str, int] = {}
        deadline = time.monotonic() + 5
        while seen != {"prefill": 3, "decode": 3} and time.monotonic() < deadline:  # wait on the condition
            seen.update(events.poll())
            time.sleep(0.01)
        assert seen == {"prefill": 3, "decode": 3}  # the latest per pool; the garbage frame was dropped
        assert events.poll() == {}
    finally:
        events.close()
        pub.close()
        ctx.term()


def test_scale_events_hand_over_moves_before_targets() -> None:
    """A RoleSet the planner relays: moved workers (refusals ignored), taken once, with the same poll's targets."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    events = ScaleEvents(f"tcp://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 5
        while not events.poll() and time.monotonic() < deadline:  # a SUB joins late: publish until seen
            pub.send(encode(ScaleRequest(seq=0, pool="decode", current=1, target=1)))
            time.sleep(0.02)
        pub.send(encode(RoleSet(request_id="r1", worker_id="prefill-0", role="decode", ok=True, seconds=0.4)))
        pub.send(encode(RoleSet(request_id="r2", worker_id="prefill-2", role="decode", ok=False,
                                reason="last worker of its pool")))
        pub.send(encode(ScaleRequest(seq=1, pool="decode", current=1, target=2)))
        targets: dict[str, int] = {}
        deadline = time.monotonic() + 5
        while targets.get("decode") != 2 and time.monotonic() < deadline:
            targets.update(events.poll())
            time.sleep(0.01)
        assert targets == {"decode": 2}
        assert events.take_roles() == {"prefill-0": "decode"}
        assert events.take_roles() == {}
        # Decided before the graph was up (a partial view): dropped.
        pub.send(encode(ScaleRequest(seq=2, pool="prefill", current=0, target=1, time_s=100.0)))
        pub.send(encode(ScaleRequest(seq=3, pool="decode", current=2, target=3, time_s=300.0)))
        targets = {}
        deadline = time.monotonic() + 5
        while "decode" not in targets and time.monotonic() < deadline:
            targets.update(events.poll(not_before_s=200.0))
            time.sleep(0.01)
        assert targets == {"decode": 3}
    finally:
        events.close()
        pub.close()
        ctx.term()
