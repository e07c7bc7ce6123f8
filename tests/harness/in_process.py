"""One router and one worker service in this test's event loop, on real loopback sockets: the scaffolding of the
worker's service tests (tests/services/worker/)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import zmq.asyncio

from cli.launcher import free_port
from services.router.service import RouterConfig, RouterService
from services.worker.config import WorkerConfig
from services.worker.engine import Engine
from services.worker.service import WorkerService


async def until(pred, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


@asynccontextmanager
async def router_and_worker(config: WorkerConfig, engine: Engine, router_config: RouterConfig | None = None,
                            ) -> AsyncIterator[tuple[RouterService, WorkerService, zmq.asyncio.Context]]:
    """A router on a free port, then the worker (``config``'s router endpoint replaced) registered with it; with a
    context for the test's own sockets. Cancels both and destroys the context on the way out."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    router = RouterService(replace(router_config or RouterConfig(), endpoint=endpoint))
    ready = asyncio.Event()
    router_task = asyncio.create_task(router.run(ready))
    worker_task = None
    ctx = zmq.asyncio.Context()
    try:
        await asyncio.wait_for(ready.wait(), 5)
        worker = WorkerService(replace(config, router_endpoint=endpoint), engine)
        worker_task = asyncio.create_task(worker.run())
        await until(lambda: router.registry.get(config.worker_id) is not None)
        yield router, worker, ctx
    finally:
        for task in (worker_task, router_task):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (worker_task, router_task) if t is not None), return_exceptions=True)
        ctx.destroy(linger=0)
