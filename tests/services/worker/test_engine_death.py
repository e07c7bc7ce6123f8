"""A worker whose engine dies under it: it deregisters from every router at once (routing moves away now, not
after the heartbeat timeout), answers what it held and what still arrives with ``worker_lost`` (the frontend
migrates those), and ``run()`` ends with ``EngineDied`` (the CLI exits 3 for its supervisor to restart it).
Real sockets on loopback, a real router, the mock engine made to fail as a dead engine core would."""

from __future__ import annotations

import asyncio

import pytest
import zmq.asyncio

from cli.launcher import free_port
from common.protocol import ErrorReply, Generate, SamplingParams
from common.transport import Client, TransportConfig
from services.router.service import RouterConfig, RouterService
from services.worker.engines.mock.engine import MockEngine
from services.worker.service import EngineDied
from tests.services.worker.test_roles import _until, _worker


def _kill_engine(engine: MockEngine) -> None:
    """What a dead engine core looks like from the worker: every request fails, the engine says why."""
    engine._fail(RuntimeError("engine core process died"))


async def test_dead_engine_deregisters_at_once_answers_worker_lost_and_ends_run() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    router = RouterService(RouterConfig(endpoint=endpoint, heartbeat_timeout_s=60.0))
    ready = asyncio.Event()
    router_task = asyncio.create_task(router.run(ready))
    await asyncio.wait_for(ready.wait(), 5)
    # speedup 1: the in-flight request is still decoding when the engine dies.
    worker = _worker("d0", "both", endpoint, speedup=1.0)
    worker_task = asyncio.create_task(worker.run())
    ctx = zmq.asyncio.Context()
    try:
        await _until(lambda: router.registry.get("d0") is not None)
        to_worker = Client(ctx, worker.endpoint, TransportConfig())
        stream = to_worker.open_stream("r1")
        await to_worker.send(Generate(request_id="r1", token_ids=tuple(range(100, 164)),
                                      sampling=SamplingParams(max_tokens=2000, ignore_eos=True)))
        await _until(lambda: bool(worker._tasks))
        _kill_engine(worker.engine)  # type: ignore[arg-type]
        # The router drops it long before its 60 s heartbeat timeout: the worker said so.
        await _until(lambda: router.registry.get("d0") is None, timeout_s=2.0)
        replies = []
        while not replies or not isinstance(replies[-1], ErrorReply):
            replies.append(await asyncio.wait_for(stream.get(), 5))
        assert replies[-1].code == "worker_lost" and "engine core process died" in replies[-1].message
        with pytest.raises(EngineDied, match="engine core process died"):
            await asyncio.wait_for(worker_task, 10)
        await to_worker.close()
    finally:
        worker_task.cancel()
        router_task.cancel()
        await asyncio.gather(worker_task, router_task, return_exceptions=True)
        ctx.destroy(linger=0)


async def test_mock_engine_is_dead_only_after_a_failure_not_before_start_or_after_shutdown() -> None:
    engine = _worker("d2", "both", "tcp://127.0.0.1:9").engine
    assert engine.dead_reason() == ""  # not started
    await engine.start()
    assert engine.dead_reason() == ""
    await engine.shutdown()
    assert engine.dead_reason() == ""  # stopped on purpose
    failed = _worker("d3", "both", "tcp://127.0.0.1:9").engine
    await failed.start()
    _kill_engine(failed)  # type: ignore[arg-type]
    assert "engine core process died" in failed.dead_reason()
    await failed.shutdown()
