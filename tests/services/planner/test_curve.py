"""CURVE on the planner's PUB socket, on real sockets: a real planner (observing a real router) publishes its
ScaleRequests to subscribers with an allowed key (`up`'s launcher and `planner-events` as ``scaler``; its own
``--scaler kubernetes`` with the planner's key); a plain SUB, or one with another cluster's key, gets nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq
import zmq.asyncio

from cli.scaling import ScaleEvents
from common.protocol import ScaleRequest, decode
from common.security import CurveKeys, load_curve_keys, make_curve_keys
from common.transport import TransportConfig
from services.planner.policy import PlannerConfig
from services.planner.service import PlannerService, PlannerServiceConfig
from services.planner.subscribe import subscribe_scale_requests
from services.planner.workload import Slo
from services.router.service import RouterConfig, RouterService
from tests.common.test_security import _running


def _outsider(ours: CurveKeys, theirs: CurveKeys) -> CurveKeys:
    """Another cluster's scaler key, knowing our planner's public key (public keys are no secret)."""
    return CurveKeys("outsider", theirs.public, theirs.secret, ours.server_keys, theirs.allowed_clients_dir)


async def _received(sub: zmq.asyncio.Socket, timeout_s: float) -> list[ScaleRequest]:
    out: list[ScaleRequest] = []
    try:
        async with asyncio.timeout(timeout_s):
            while len(out) < 4:
                msg = decode(await sub.recv())
                assert isinstance(msg, ScaleRequest)
                out.append(msg)
    except TimeoutError:
        pass
    return out


async def test_planner_pub_serves_listed_subscribers_only(tmp_path: Path) -> None:
    ours, theirs = make_curve_keys(tmp_path / "ours"), make_curve_keys(tmp_path / "theirs")
    keys = {s: load_curve_keys(ours / s) for s in ("router", "planner", "scaler")}
    outsider = _outsider(keys["scaler"], load_curve_keys(theirs / "scaler"))
    router = RouterService(RouterConfig(endpoint="tcp://127.0.0.1:0", transport=TransportConfig(curve=keys["router"])))
    async with _running(router):
        planner = PlannerService(PlannerServiceConfig(
            router_endpoint=router.endpoint, metrics_urls=(), policy=PlannerConfig(slo=Slo(ttft_ms=1000, itl_ms=100)),
            interval_s=0.05, window_s=0.1, transport=TransportConfig(curve=keys["planner"])))
        async with _running(planner):
            ctx = zmq.asyncio.Context()
            subs = {"plain": subscribe_scale_requests(ctx, planner.events_endpoint),
                    "outsider": subscribe_scale_requests(ctx, planner.events_endpoint, outsider),
                    "planner": subscribe_scale_requests(ctx, planner.events_endpoint, keys["planner"])}
            launcher = ScaleEvents(planner.events_endpoint, keys["scaler"])  # `up`'s synchronous subscriber
            try:
                got = dict(zip(subs, await asyncio.gather(*(_received(s, 3.0) for s in subs.values()))))
                assert got["plain"] == [] and got["outsider"] == []
                assert {m.pool for m in got["planner"]} == {"prefill", "decode"}  # the kube scaler's key
                # Every interval publishes both pools again: the launcher's key sees them too (and the
                # planner kept publishing through the refused handshakes).
                for _ in range(60):
                    if latest := launcher.poll():
                        break
                    await asyncio.sleep(0.05)
                assert set(latest) <= {"prefill", "decode"} and latest
            finally:
                launcher.close()
                for sub in subs.values():
                    sub.close(linger=0)
                ctx.term()
