"""Migration excludes the lost worker process, not its id: the same worker restarted (same id, new instance) is
routed to; the dead instance never is."""

from __future__ import annotations

from common.protocol import (
    PROTOCOL_VERSION,
    ErrorReply,
    RegisterAck,
    RegisterWorker,
    Route,
    RouteRequest,
    WorkerInfo,
)
from services.router.service import RouterConfig, RouterService


def _register(svc: RouterService, instance_id: str) -> None:
    info = WorkerInfo(worker_id="decode-1", role="decode", model="m", block_size=32, num_blocks=64,
                      endpoint=f"tcp://127.0.0.1:{5000 + len(instance_id)}", instance_id=instance_id)
    assert isinstance(svc.handle(b"d", RegisterWorker(request_id="r", info=info,
                                                      protocol_version=PROTOCOL_VERSION)), RegisterAck)


def test_restarted_worker_is_eligible_its_dead_instance_is_not() -> None:
    svc = RouterService(RouterConfig())
    svc.events_endpoint = "tcp://127.0.0.1:9"
    _register(svc, "wi-old")
    first = svc.handle(b"f", RouteRequest(request_id="q", model="m", token_ids=(1, 2, 3)))
    assert isinstance(first, Route) and first.decode.instance_id == "wi-old"
    # The frontend lost that process; until a new one registers there is no capable worker (it waits).
    retry = RouteRequest(request_id="q", model="m", token_ids=(1, 2, 3), exclude_instance_ids=("wi-old",))
    refused = svc.handle(b"f", retry)
    assert isinstance(refused, ErrorReply) and refused.code == "no_worker"
    _register(svc, "wi-new-instance")  # `up` restarted it: same worker id
    again = svc.handle(b"f", retry)
    assert isinstance(again, Route)
    assert (again.decode.worker_id, again.decode.instance_id) == ("decode-1", "wi-new-instance")
