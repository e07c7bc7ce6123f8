"""A request that ends brings the worker's next heartbeat forward: routers count what they routed since a beat as
queued there, and a lone client's next prompt, routed before the beat, looked queued behind its last one (the kv
router prefilled it on the idle decode worker instead). Real sockets on loopback, a real router, a mock worker
whose regular beat is a minute away."""

from __future__ import annotations

import asyncio

from common.protocol import Generate, SamplingParams, Tokens
from common.transport import Client, TransportConfig
from services.router.service import RouterConfig
from services.worker.config import WorkerConfig
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.engine import MockEngine
from tests.harness.in_process import router_and_worker, until


async def test_a_finished_request_reports_the_load_before_the_next_regular_beat() -> None:
    config = WorkerConfig(worker_id="p0", role="prefill", model="m", router_endpoint="", heartbeat_interval_s=60.0)
    async with router_and_worker(config, MockEngine(MockEngineConfig(num_blocks=64, engine_id="p0")),
                                 RouterConfig(heartbeat_timeout_s=600.0)) as (router, worker, ctx):
        await until(lambda: worker._heartbeat_seq == 1)
        router.registry.note_routed("p0", num_prefill_tokens=64)  # what the router counts until a beat
        assert router.registry.get("p0").num_routed_since_report == 1
        to_worker = Client(ctx, worker.endpoint, TransportConfig())
        stream = to_worker.open_stream("r1")
        await to_worker.send(Generate(request_id="r1", token_ids=tuple(range(100, 164)), prefill_only=True,
                                      sampling=SamplingParams(max_tokens=1)))
        reply = await asyncio.wait_for(stream.get(), 5)
        assert isinstance(reply, Tokens) and reply.finish_reason is not None
        # The beat after it replaces the router's guess with the engine's load: nothing queued, nothing running.
        await until(lambda: router.registry.get("p0").num_routed_since_report == 0)
        entry = router.registry.get("p0")
        assert worker._heartbeat_seq == 2
        assert (entry.load.num_waiting, entry.load.num_running) == (0, 0)
        await to_worker.close()
