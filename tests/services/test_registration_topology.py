"""Workers and kvtier register where peers dial them (advertised, never the bind address) and which node and
zone they run on; the router lists both and labels its metrics with them. Real sockets, on loopback."""

from __future__ import annotations

import asyncio

import zmq.asyncio

from cli.launcher import free_port
from common.protocol import ListWorkers, WorkerList
from common.transport import Client, TransportConfig, new_id
from services.kvtier.service import KvTierConfig, KvTierService
from services.router.service import RouterConfig, RouterService
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.engine import MockEngine
from services.worker.config import WorkerConfig
from services.worker.service import WorkerService


async def _until(pred, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_worker_and_tier_register_advertised_endpoint_node_and_zone() -> None:
    router_endpoint = f"tcp://127.0.0.1:{free_port()}"
    router = RouterService(RouterConfig(endpoint=router_endpoint))
    worker_port = free_port()
    # A bare-host --advertise keeps the bound port; "localhost" stands for this host's routable name.
    worker = WorkerService(WorkerConfig(worker_id="d0", role="decode", model="m", router_endpoint=router_endpoint,
                                        endpoint=f"tcp://127.0.0.1:{worker_port}", advertise_endpoint="localhost",
                                        node="host-c", zone="rack-2"),
                           MockEngine(MockEngineConfig(num_blocks=64, engine_id="d0")))
    tier = KvTierService(KvTierConfig(endpoint="tcp://127.0.0.1:0", advertise_endpoint="tcp://kvtier-c:5570",
                                      router_endpoint=router_endpoint, host_bytes=1 << 20, block_bytes=4096,
                                      nixl=False, node="host-c", zone="rack-2"))
    ready = asyncio.Event()
    tasks = [asyncio.create_task(router.run(ready))]
    await asyncio.wait_for(ready.wait(), 5)
    tasks += [asyncio.create_task(worker.run()), asyncio.create_task(tier.run())]
    ctx = zmq.asyncio.Context()
    client = Client(ctx, router_endpoint, TransportConfig())
    try:
        await _until(lambda: router.registry.get("d0") is not None and "kvtier-0" in router.tiers.info)
        listed = await client.request(ListWorkers(request_id=new_id("ls")), timeout_s=2.0)
        assert isinstance(listed, WorkerList)
        (info,) = listed.workers
        assert (info.endpoint, info.node, info.zone) == (f"tcp://localhost:{worker_port}", "host-c", "rack-2")
        registered = router.tiers.info["kvtier-0"]
        assert (registered.endpoint, registered.node, registered.zone) == ("tcp://kvtier-c:5570", "host-c", "rack-2")
        labels = {"worker_id": "d0", "role": "decode", "node": "host-c", "zone": "rack-2"}
        assert router.metrics.registry.get_sample_value("splitserve_router_worker_info", labels) == 1.0
        router._drop("d0", reason="test")
        assert router.metrics.registry.get_sample_value("splitserve_router_worker_info", labels) is None
    finally:
        await client.close()
        for task in reversed(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.destroy(linger=0)
