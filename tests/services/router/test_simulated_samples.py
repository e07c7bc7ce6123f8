"""Simulated samples (the mock engine's made-up transfers and tier loads) teach the router no link and no tier
speed: they are counted apart; real ones beside them still teach."""

from __future__ import annotations

import re

import msgspec
import pytest
from prometheus_client import generate_latest

from common.protocol import (
    PROTOCOL_VERSION,
    Heartbeat,
    RegisterAck,
    RegisterWorker,
    TierLoadSample,
    TransferSample,
    WorkerInfo,
    WorkerLoad,
    decode,
    encode,
)
from services.router.service import RouterConfig, RouterService
from services.router.tier_credit import TierConfig
from services.router.topology import TopologyConfig
from services.router.transfer_samples import samples_that_teach

MB = 1 << 20


def _t(seq: int, simulated: bool = False) -> TransferSample:
    return TransferSample(seq=seq, seconds=0.03, num_bytes=20_000_000, src_worker_id="p", simulated=simulated)


def _l(seq: int, simulated: bool = False) -> TierLoadSample:
    return TierLoadSample(seq=seq, tier="host", num_bytes=seq * MB, seconds=0.002 + seq * MB / 2e8,
                          simulated=simulated)


@pytest.mark.parametrize(("samples", "teach", "num_simulated"), [
    pytest.param((), (), 0, id="none"),
    pytest.param((_t(1), _t(2)), (_t(1), _t(2)), 0, id="all-real"),
    pytest.param((_t(1, True), _t(2, True)), (), 2, id="all-simulated"),
    pytest.param((_t(1), _t(2, True), _t(3)), (_t(1), _t(3)), 1, id="mixed-order-kept"),
    pytest.param((_l(1, True), _l(2)), (_l(2),), 1, id="tier-loads"),
])
def test_samples_that_teach(samples: tuple, teach: tuple, num_simulated: int) -> None:
    assert samples_that_teach(samples) == (teach, num_simulated)


class OldTransferSample(msgspec.Struct, frozen=True, omit_defaults=True):
    """A TransferSample as a release from before ``simulated`` reads it."""

    seq: int
    seconds: float
    num_bytes: int


def test_simulated_is_on_the_wire_only_when_set() -> None:
    real, fake = _t(1), _t(1, simulated=True)
    assert b"simulated" not in msgspec.msgpack.encode(real)  # omit_defaults: a real sample's bytes are unchanged
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(fake), type=TransferSample).simulated
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(fake), type=OldTransferSample).num_bytes == 20_000_000
    beat = Heartbeat(worker_id="d", load=WorkerLoad(), transfers=(fake,), tier_loads=(_l(1, True),))
    assert decode(encode(beat)) == beat


def _router() -> RouterService:
    svc = RouterService(RouterConfig(pending_ttl_s=0.0))
    svc.events_endpoint = "tcp://127.0.0.1:9"
    for worker_id, role, node in [("d", "decode", "a"), ("p", "prefill", "c")]:
        info = WorkerInfo(worker_id=worker_id, role=role, model="m", block_size=16, num_blocks=1000,
                          endpoint=f"tcp://127.0.0.1:1{len(worker_id)}", node=node, zone="z")
        assert isinstance(svc.handle(worker_id.encode(), RegisterWorker(request_id="r", info=info,
                                                                    protocol_version=PROTOCOL_VERSION)), RegisterAck)
    return svc


def _metric(svc: RouterService, name: str) -> float | None:
    text = generate_latest(svc.metrics.registry).decode()
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return None if match is None else float(match.group(1))


NUM_TEACHING = 1 + TopologyConfig().min_samples  # the pair's wire-up, then enough to learn the link


def test_simulated_transfers_teach_no_link() -> None:
    svc = _router()
    beat = tuple(_t(seq, simulated=True) for seq in range(1, NUM_TEACHING + 1))
    assert svc.handle(b"d", Heartbeat(worker_id="d", load=WorkerLoad(), transfers=beat)) is None
    assert svc.topology.learned_links() == {}
    assert _metric(svc, 'splitserve_router_simulated_samples_total{kind="transfer"}') == NUM_TEACHING
    assert _metric(svc, 'splitserve_router_transfer_samples_total{used="yes"}') is None
    assert _metric(svc, 'splitserve_router_transfer_samples_total{used="no"}') is None


def test_real_transfers_teach_the_link_beside_simulated_ones() -> None:
    svc = _router()
    beat = tuple(_t(seq, simulated=seq % 2 == 0) for seq in range(1, 2 * NUM_TEACHING + 1))  # odd ones real
    assert svc.handle(b"d", Heartbeat(worker_id="d", load=WorkerLoad(), transfers=beat)) is None
    assert svc.topology.learned_links() == {("c", "a"): pytest.approx(20_000_000 / 0.03, rel=0.1)}
    assert _metric(svc, 'splitserve_router_simulated_samples_total{kind="transfer"}') == NUM_TEACHING
    assert _metric(svc, 'splitserve_router_transfer_samples_total{used="yes"}') == NUM_TEACHING - 1
    assert _metric(svc, 'splitserve_router_transfer_samples_total{used="no"}') == 1  # the wire-up


def test_simulated_tier_loads_teach_no_tier_speed() -> None:
    svc = _router()
    fake = tuple(_l(seq, simulated=True) for seq in (1, 2, 4))
    assert svc.handle(b"d", Heartbeat(worker_id="d", load=WorkerLoad(), tier_loads=fake)) is None
    assert svc.policy.config.tiers == TierConfig()
    assert _metric(svc, 'splitserve_router_simulated_samples_total{kind="tier_load"}') == 3
    assert _metric(svc, 'splitserve_router_tier_load_samples_total{tier="host"}') is None
    real = tuple(_l(seq) for seq in (1, 2, 4))
    assert svc.handle(b"d", Heartbeat(worker_id="d", load=WorkerLoad(), tier_loads=real)) is None
    assert svc.policy.config.tiers.host_bytes_per_s == pytest.approx(2e8, rel=1e-3)
    assert _metric(svc, 'splitserve_router_tier_load_samples_total{tier="host"}') == 3
