"""A finished prefill's frontend may still abort it (its decode will not come: the engine frees the KV it holds
for the decode); another frontend may not. Real sockets on loopback, a real router, the mock engine."""

from __future__ import annotations

import asyncio

import zmq

from common.protocol import Abort, Generate, SamplingParams, Tokens, decode, encode
from common.timing import TimingModel
from services.worker.config import WorkerConfig
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.engine import MockEngine
from tests.harness.in_process import router_and_worker, until


class RecordingEngine(MockEngine):
    """The mock engine, recording the aborts the worker passes on."""

    def __init__(self, config: MockEngineConfig) -> None:
        super().__init__(config)
        self.aborted: list[str] = []

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        await super().abort(request_id)


async def test_only_its_frontend_releases_a_finished_prefill() -> None:
    engine = RecordingEngine(MockEngineConfig(num_blocks=256, engine_id="p0",
                                              timing=TimingModel(speedup=float("inf"))))
    config = WorkerConfig(worker_id="p0", role="prefill", model="m", router_endpoint="")
    async with router_and_worker(config, engine) as (_, worker, ctx):
        asker, other = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)  # closed with the context
        for sock in (asker, other):
            sock.connect(worker.endpoint)
        await asker.send(encode(Generate(request_id="r1", token_ids=tuple(range(100, 200)),
                                         sampling=SamplingParams(max_tokens=8), prefill_only=True)))
        reply = decode(await asyncio.wait_for(asker.recv(), 5))
        assert isinstance(reply, Tokens) and reply.finish_reason is not None
        await until(lambda: not worker._tasks)

        await other.send(encode(Abort(request_id="r1")))  # not the frontend that asked: refused, still held
        await asker.send(encode(Abort(request_id="never")))  # nothing held: nothing to do
        await asker.send(encode(Abort(request_id="r1")))
        await until(lambda: engine.aborted)
        await asker.send(encode(Abort(request_id="r1")))  # released once
        await asker.send(encode(Abort(request_id="r1")))
        await asyncio.sleep(0.3)  # time for the two to arrive
        assert engine.aborted == ["r1"]
