"""A worker moved between pools in place: it is the source of truth for its role, so every router replica follows
it. Real sockets on loopback: two routers, mock workers, a SetRole sent to one router."""

from __future__ import annotations

import asyncio

import zmq.asyncio

from cli.launcher import free_port
from common.protocol import Generate, RoleSet, SamplingParams, SetRole, Tokens
from common.transport import Client, TransportConfig, new_id
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


def _worker(worker_id: str, role: str, routers: str, switchable: bool = True, speedup: float = float("inf")):
    from common.timing import TimingModel

    return WorkerService(WorkerConfig(worker_id=worker_id, role=role, model="m", router_endpoint=routers,  # type: ignore[arg-type]
                                      switchable=switchable),
                         MockEngine(MockEngineConfig(num_blocks=256, engine_id=worker_id,
                                                     timing=TimingModel(speedup=speedup))))


def test_worker_refuses_what_it_cannot_do() -> None:
    fixed = _worker("d0", "decode", "tcp://127.0.0.1:9", switchable=False)
    answer = fixed.set_role(SetRole(request_id="x", worker_id="d0", role="prefill"))
    assert (answer.ok, answer.role, answer.reason) == (False, "decode", "not switchable")
    flex = _worker("f0", "prefill", "tcp://127.0.0.1:9")
    assert not flex.set_role(SetRole(request_id="y", worker_id="f0", role="both")).ok  # type: ignore[arg-type]
    assert flex._info().switchable and flex._info().role == "prefill"
    moved = flex.set_role(SetRole(request_id="z", worker_id="f0", role="decode"))
    assert (moved.ok, moved.role, flex.role, flex._info().role) == (True, "decode", "decode", "decode")
    # Its metrics are labelled with the role it has now, and only that one.
    sample = flex.metrics.registry.get_sample_value
    assert sample("splitserve_worker_running", {"worker_id": "f0", "role": "decode"}) == 0.0
    assert sample("splitserve_worker_running", {"worker_id": "f0", "role": "prefill"}) is None
    flex._draining = True
    assert flex.set_role(SetRole(request_id="w", worker_id="f0", role="prefill")).reason == "draining"


async def test_switch_through_one_replica_moves_the_worker_in_every_replica() -> None:
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    routers = [RouterService(RouterConfig(endpoint=e)) for e in endpoints]
    tasks = []
    for router in routers:
        ready = asyncio.Event()
        tasks.append(asyncio.create_task(router.run(ready)))
        await asyncio.wait_for(ready.wait(), 5)
    both = ",".join(endpoints)
    # f0 is slow enough (1/20 of the modelled engine's time) that its prefill is still running at the switch.
    workers = [_worker("p0", "prefill", both), _worker("d0", "decode", both), _worker("f0", "prefill", both, speedup=20)]
    tasks += [asyncio.create_task(w.run()) for w in workers]
    ctx = zmq.asyncio.Context()
    client = Client(ctx, endpoints[0], TransportConfig())
    try:
        await _until(lambda: all(len(r.registry) == 3 for r in routers))
        # A prefill in flight on f0 when it moves finishes there, with its KV handed out for a pull.
        flex = workers[2]
        to_flex = Client(ctx, flex.endpoint, TransportConfig())
        stream = to_flex.open_stream("pre-1")
        await to_flex.send(Generate(request_id="pre-1", token_ids=tuple(range(100, 4100)),
                                    sampling=SamplingParams(max_tokens=1), prefill_only=True))
        await asyncio.sleep(0.05)
        answer = await client.request(SetRole(request_id=new_id("set"), worker_id="f0", role="decode",
                                              reason="test"), timeout_s=3.0)
        assert isinstance(answer, RoleSet) and answer.ok and answer.role == "decode", answer
        assert 0.0 < answer.seconds < 1.0
        assert flex.role == "decode" and flex._tasks  # switched while its prefill still runs
        assert routers[0].registry.get("f0").info.role == "decode"
        await _until(lambda: routers[1].registry.get("f0").info.role == "decode", timeout_s=1.0)
        done = await asyncio.wait_for(stream.get(), 10)
        assert isinstance(done, Tokens) and done.finish_reason is not None and done.kv_transfer is not None
        to_flex.close_stream("pre-1")
        await to_flex.close()
        # Back through the other replica; then p0 may leave prefill (f0 is there), after which f0 may not.
        other = Client(ctx, endpoints[1], TransportConfig())
        back = await other.request(SetRole(request_id=new_id("set"), worker_id="f0", role="prefill"), timeout_s=3.0)
        assert isinstance(back, RoleSet) and back.ok
        await _until(lambda: routers[0].registry.get("f0").info.role == "prefill", timeout_s=1.0)
        last = await other.request(SetRole(request_id=new_id("set"), worker_id="p0", role="decode"), timeout_s=3.0)
        assert isinstance(last, RoleSet) and last.ok  # f0 is prefill again: p0 is not the last one
        await _until(lambda: routers[0].registry.get("p0").info.role == "decode", timeout_s=1.0)
        no = await other.request(SetRole(request_id=new_id("set"), worker_id="f0", role="decode"), timeout_s=3.0)
        assert isinstance(no, RoleSet) and not no.ok and no.reason == "last serving worker of the prefill pool"
        await other.close()
    finally:
        await client.close()
        for task in reversed(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.term()
