"""A subscriber to the planner's ScaleRequests (its PUB socket): the launcher, ``planner-events``, the Kubernetes
scaler. With CURVE the subscriber dials as a client of the planner's key; a key not on the planner's allow-list
never completes the handshake, so it receives nothing (PUB/SUB has no error to report)."""

from __future__ import annotations

import zmq

from common.security import CurveKeys, secure_client


def subscribe_scale_requests(ctx: zmq.Context, endpoint: str, curve: CurveKeys | None = None) -> zmq.Socket:
    """A SUB socket of ``ctx`` (plain or asyncio) subscribed to everything the planner at ``endpoint`` publishes."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    secure_client(sub, curve.toward("planner") if curve is not None else None)
    sub.connect(endpoint)
    return sub
