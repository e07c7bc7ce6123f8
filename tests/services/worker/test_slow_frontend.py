"""A frontend that stops reading: the worker's output to it waits in a bounded backlog (common/outbox.py), its
requests' output pauses, and once that frontend has read nothing for the stall timeout its requests are aborted
and their KV blocks are free again. Real sockets on loopback, a real router, the mock engine at full speed (16
requests with 20 logprobs a token: megabytes a second, more than the sockets' and kernel's buffers absorb)."""

from __future__ import annotations

import asyncio

import zmq

from common.outbox import OutboxLimits
from common.protocol import Generate, GetStats, SamplingParams, encode
from common.timing import TimingModel
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.engine import MockEngine
from services.worker.config import WorkerConfig
from tests.harness.in_process import router_and_worker, until

LIMITS = OutboxLimits(max_messages=32, max_bytes=256 * 1024, stall_timeout_s=0.5, socket_frames=8)
NUM_REQUESTS = 16


async def test_a_frontend_that_stops_reading_gets_its_requests_aborted_and_the_blocks_freed() -> None:
    engine = MockEngine(MockEngineConfig(num_blocks=8192, engine_id="d0", timing=TimingModel(speedup=float("inf"))))
    config = WorkerConfig(worker_id="d0", role="both", model="m", router_endpoint="", outbox=LIMITS)
    async with router_and_worker(config, engine) as (_, worker, ctx):
        frontend = ctx.socket(zmq.DEALER)  # closed with the context, as is the other one below
        frontend.setsockopt(zmq.RCVHWM, 4)
        frontend.setsockopt(zmq.RCVBUF, 4096)
        total_blocks = engine.load().num_free_blocks
        frontend.connect(worker.endpoint)
        # Long generations, then this "frontend" reads nothing.
        for i in range(NUM_REQUESTS):
            await frontend.send(encode(Generate(request_id=f"r{i}", token_ids=tuple(range(100, 200)),
                                                sampling=SamplingParams(max_tokens=3_900, ignore_eos=True,
                                                                        logprobs=20))))
        await until(lambda: engine.load().num_free_blocks < total_blocks, timeout_s=5.0)
        # Aborted: the tasks are gone, the blocks are back, the backlog held no more than its limits.
        await until(lambda: not worker._tasks, timeout_s=60.0)
        assert engine.load().num_free_blocks == total_blocks
        assert worker._outbox.num_stalled == NUM_REQUESTS, "every request was stopped by the stall"
        for identity in worker._outbox._pending:
            num_msgs, _ = worker._outbox.backlog(identity)
            assert num_msgs <= LIMITS.max_messages + NUM_REQUESTS  # the abort replies queue behind it
        # The worker serves on: another frontend's request is answered.
        other = ctx.socket(zmq.DEALER)
        other.connect(worker.endpoint)
        await other.send(encode(GetStats(request_id="s1")))
        assert await asyncio.wait_for(other.recv(), 5)
