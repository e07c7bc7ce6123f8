"""CURVE on real sockets: a peer with the cluster's client key is served, one without is refused."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from common.errors import TransportTimeout
from common.protocol import ListWorkers, WorkerList
from common.security import SecureContext, load_curve_keys, make_curve_keys
from common.transport import Client, TransportConfig, new_id
from services.router.service import RouterConfig, RouterService


async def test_unauthenticated_peer_is_refused(tmp_path) -> None:
    keys = load_curve_keys(make_curve_keys(tmp_path / "keys"))
    outsider = load_curve_keys(make_curve_keys(tmp_path / "other"))  # valid CURVE, wrong cluster
    secure = TransportConfig(curve=keys)
    router = RouterService(RouterConfig(endpoint="tcp://127.0.0.1:0", transport=secure))
    ready = asyncio.Event()
    task = asyncio.create_task(router.run(ready))
    await ready.wait()
    member = SecureContext(keys)
    plain = SecureContext(None)
    try:
        good = Client(member.ctx, router.endpoint, secure)
        reply = await good.request(ListWorkers(request_id=new_id("t")), timeout_s=5)
        assert isinstance(reply, WorkerList)
        no_keys = Client(plain.ctx, router.endpoint, TransportConfig())
        with pytest.raises(TransportTimeout):
            await no_keys.request(ListWorkers(request_id=new_id("t")), timeout_s=1)
        # Knows the server's public key, but its client key is not in the cluster's allowed list.
        impostor = replace(keys, client_public=outsider.client_public, client_secret=outsider.client_secret)
        wrong_key = Client(plain.ctx, router.endpoint, TransportConfig(curve=impostor))
        with pytest.raises(TransportTimeout):
            await wrong_key.request(ListWorkers(request_id=new_id("t")), timeout_s=1)
        for c in (good, no_keys, wrong_key):
            await c.close()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        member.close()
        plain.close()
