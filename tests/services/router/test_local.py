"""The router's in-process entry (a frontend hosting a replica): routes and lists as over its socket."""

from __future__ import annotations

import pytest

from common.errors import ProtocolError
from common.protocol import (
    PROTOCOL_VERSION,
    ErrorReply,
    ListWorkers,
    RegisterWorker,
    Route,
    RouteRequest,
    Unregister,
    WorkerInfo,
    WorkerList,
)
from services.router.service import RouterConfig, RouterService


def test_local_routes_and_lists_like_the_socket() -> None:
    svc = RouterService(RouterConfig())
    svc.events_endpoint = "tcp://127.0.0.1:9"
    refused = svc.local(RouteRequest(request_id="q0", model="m", token_ids=(1, 2, 3)))
    assert isinstance(refused, ErrorReply) and refused.code == "no_worker"
    info = WorkerInfo(worker_id="both-0", role="both", model="m", block_size=32, num_blocks=64,
                      endpoint="tcp://127.0.0.1:5001")
    svc.handle(b"w", RegisterWorker(request_id="r", info=info, protocol_version=PROTOCOL_VERSION))
    route = svc.local(RouteRequest(request_id="q1", model="m", token_ids=(1, 2, 3)))
    assert isinstance(route, Route) and route.decode.worker_id == "both-0"
    over_socket = svc.handle(b"f", RouteRequest(request_id="q2", model="m", token_ids=(1, 2, 3)))
    assert isinstance(over_socket, Route) and over_socket.decode == route.decode
    listed = svc.local(ListWorkers(request_id="ls"))
    assert isinstance(listed, WorkerList) and [w.worker_id for w in listed.workers] == ["both-0"]
    with pytest.raises(ProtocolError):  # only what a frontend asks: registrations come over the socket
        svc.local(Unregister(worker_id="both-0"))
