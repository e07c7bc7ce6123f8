"""A finished prefill's frontend may still abort it (its decode will not come: the engine frees the KV it holds
for the decode); another frontend may not. Real sockets on loopback, a real router, the mock engine."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from cli.launcher import free_port
from common.protocol import Abort, Generate, SamplingParams, Tokens, decode, encode
from common.timing import TimingModel
from services.router.service import RouterConfig, RouterService
from services.worker.config import WorkerConfig
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.engine import MockEngine
from services.worker.service import WorkerService
from tests.services.worker.test_roles import _until


class RecordingEngine(MockEngine):
    """The mock engine, recording the aborts the worker passes on."""

    def __init__(self, config: MockEngineConfig) -> None:
        super().__init__(config)
        self.aborted: list[str] = []

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        await super().abort(request_id)


async def test_only_its_frontend_releases_a_finished_prefill() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    router = RouterService(RouterConfig(endpoint=endpoint))
    ready = asyncio.Event()
    router_task = asyncio.create_task(router.run(ready))
    await asyncio.wait_for(ready.wait(), 5)
    engine = RecordingEngine(MockEngineConfig(num_blocks=256, engine_id="p0",
                                              timing=TimingModel(speedup=float("inf"))))
    worker = WorkerService(WorkerConfig(worker_id="p0", role="prefill", model="m", router_endpoint=endpoint), engine)
    worker_task = asyncio.create_task(worker.run())
    ctx = zmq.asyncio.Context()
    asker, other = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    try:
        await _until(lambda: router.registry.get("p0") is not None)
        for sock in (asker, other):
            sock.connect(worker.endpoint)
        await asker.send(encode(Generate(request_id="r1", token_ids=tuple(range(100, 200)),
                                         sampling=SamplingParams(max_tokens=8), prefill_only=True)))
        reply = decode(await asyncio.wait_for(asker.recv(), 5))
        assert isinstance(reply, Tokens) and reply.finish_reason is not None
        await _until(lambda: not worker._tasks)

        await other.send(encode(Abort(request_id="r1")))  # not the frontend that asked: refused, still held
        await asker.send(encode(Abort(request_id="never")))  # nothing held: nothing to do
        await asker.send(encode(Abort(request_id="r1")))
        await _until(lambda: engine.aborted)
        await asker.send(encode(Abort(request_id="r1")))  # released once
        await asker.send(encode(Abort(request_id="r1")))
        await asyncio.sleep(0.3)  # time for the two to arrive
        assert engine.aborted == ["r1"]
    finally:
        asker.close(linger=0)
        other.close(linger=0)
        worker_task.cancel()
        router_task.cancel()
        await asyncio.gather(worker_task, router_task, return_exceptions=True)
        ctx.destroy(linger=0)
