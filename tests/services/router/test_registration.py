"""Registration refuses a peer of another wire version, loudly, and keeps serving the others."""

from __future__ import annotations

import pytest

from common.errors import RegistrationRefused
from common.protocol import (
    PROTOCOL_VERSION,
    ErrorReply,
    RegisterAck,
    RegisterTier,
    RegisterWorker,
    WorkerInfo,
)
from services.router.registry import check_protocol_version
from services.router.service import RouterConfig, RouterService

INFO = WorkerInfo(worker_id="w0", role="both", model="m", block_size=32, num_blocks=8, endpoint="tcp://127.0.0.1:1")


@pytest.mark.parametrize("version", [0, PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1])
def test_other_versions_are_refused_naming_both(version: int) -> None:
    with pytest.raises(RegistrationRefused, match=f"version {version} but this router speaks {PROTOCOL_VERSION}"):
        check_protocol_version("w0", version)


def test_router_refuses_a_worker_and_a_tier_of_another_release() -> None:
    svc = RouterService(RouterConfig())
    svc.events_endpoint = "tcp://127.0.0.1:9"
    old_worker = svc.handle(b"w0", RegisterWorker(request_id="r1", info=INFO))  # no version: an older release
    assert isinstance(old_worker, ErrorReply) and old_worker.code == "registration_refused"
    assert svc.registry.get("w0") is None
    old_tier = svc.handle(b"t", RegisterTier(request_id="r2", tier_id="kvtier-0", endpoint="tcp://127.0.0.1:5",
                                             protocol_version=PROTOCOL_VERSION + 1))
    assert isinstance(old_tier, ErrorReply) and old_tier.code == "registration_refused"
    ok = svc.handle(b"w0", RegisterWorker(request_id="r3", info=INFO, protocol_version=PROTOCOL_VERSION))
    assert isinstance(ok, RegisterAck) and svc.registry.get("w0") is not None
