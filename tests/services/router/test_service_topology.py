"""The router learns links from the transfers workers report in heartbeats (decode workers' pulls, prefill workers'
pushes), and routes with them."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from common.protocol import (
    PROTOCOL_VERSION,
    ErrorReply,
    Heartbeat,
    RegisterAck,
    RegisterWorker,
    Route,
    RouteRequest,
    TransferSample,
    WorkerInfo,
    WorkerLoad,
)
from services.router.cost import CostConfig
from services.router.policy import PolicyConfig
from services.router.transfer_samples import link_ends
from services.router.service import RouterConfig, RouterService
from services.router.topology import Place, TopologyConfig

KV_BYTES = 10_000
TOPOLOGY = TopologyConfig(same_zone_bytes_per_s=1e8, cross_zone_bytes_per_s=1e7, cross_zone_latency_s=0.01)
COST = CostConfig(prefill_tokens_per_s=1000.0, local_prefill_factor=1.5, topology=TOPOLOGY)


def _router(cost: CostConfig = COST, max_stall_s: float = float("inf")) -> RouterService:
    """``max_stall_s``: the stall cap on local prefills (inf here: these tests are about prices and links)."""
    svc = RouterService(RouterConfig(policy=PolicyConfig(cost=cost, local_prefill_max_stall_s=max_stall_s),
                                     pending_ttl_s=0.0))
    svc.events_endpoint = "tcp://127.0.0.1:9"
    for worker_id, role, node, zone in [("d", "decode", "a", "z1"), ("p", "prefill", "c", "z2")]:
        info = WorkerInfo(worker_id=worker_id, role=role, model="m", block_size=16, num_blocks=1000,
                          endpoint=f"tcp://127.0.0.1:1{len(node)}", node=node, zone=zone,
                          kv_bytes_per_token=KV_BYTES)
        assert isinstance(svc.handle(worker_id.encode(), RegisterWorker(request_id="r", info=info,
                                                                    protocol_version=PROTOCOL_VERSION)), RegisterAck)
    return svc


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 8000) for _ in range(2000)]


def _prefill_worker(svc: RouterService, prompt: list[int]) -> str | None:
    reply = svc.handle(b"fe", RouteRequest(request_id="q", model="m", token_ids=tuple(prompt)))
    assert isinstance(reply, Route)
    return reply.prefill.worker_id if reply.prefill is not None else None


def _beat(svc: RouterService, samples: tuple[TransferSample, ...]) -> None:
    assert svc.handle(b"d", Heartbeat(worker_id="d", load=WorkerLoad(num_waiting_tokens=0), transfers=samples)) is None


def test_heartbeat_samples_teach_the_link_and_change_the_route() -> None:
    svc = _router()
    # Default cross-zone link 1e7 bytes/s: moving 2e7 bytes (2 s) costs more than local prefill (3 s vs 4.01 s).
    assert _prefill_worker(svc, _prompt(0)) is None
    # d's first pull from p (5 s: NIXL's wire-up) teaches nothing; then 2e7 bytes in 0.03 s: c -> a runs at
    # 1e9 bytes/s. One sample from an unknown worker and one unattributed: ignored.
    _beat(svc, (TransferSample(seq=1, seconds=5.0, num_bytes=20_000_000, src_worker_id="p"),
                TransferSample(seq=2, seconds=0.03, num_bytes=20_000_000, src_worker_id="p"),
                TransferSample(seq=3, seconds=5.0, num_bytes=20_000_000, src_worker_id="gone"),
                TransferSample(seq=4, seconds=5.0, num_bytes=20_000_000)))
    # One sample of the three a link needs: still the default, still local.
    assert svc.topology.learned_links() == {}
    assert _prefill_worker(svc, _prompt(2)) is None
    _beat(svc, tuple(TransferSample(seq=seq, seconds=0.03, num_bytes=20_000_000, src_worker_id="p")
                     for seq in (5, 6)))
    assert svc.topology.learned_links() == {("c", "a"): pytest.approx(1e9)}
    assert svc.topology.link(Place("c", "z2"), Place("a", "z1")).learned
    # A new prompt (the first ones are now cached on d: the approximate index recorded them there).
    assert _prefill_worker(svc, _prompt(1)) == "p"
    text = generate_latest(svc.metrics.registry).decode()
    gauge = re.search(r'^splitserve_router_link_bandwidth_bytes_per_second\{dst_node="a",src_node="c"\} (\S+)$',
                      text, re.M)
    assert gauge is not None and float(gauge.group(1)) == pytest.approx(1e9)
    assert 'splitserve_router_transfer_samples_total{used="yes"} 3.0' in text
    assert 'splitserve_router_transfer_samples_total{used="no"} 3.0' in text
    assert 'splitserve_router_predicted_prefill_seconds_count{relation="cross_zone",where="remote"} 1.0' in text
    assert 'splitserve_router_predicted_prefill_seconds_count{relation="same_node",where="local"} 2.0' in text


def test_a_reregistered_worker_wires_up_again() -> None:
    svc = _router()
    _beat(svc, (TransferSample(seq=1, seconds=5.0, num_bytes=20_000_000, src_worker_id="p"),))  # wire-up
    _beat(svc, (TransferSample(seq=2, seconds=0.03, num_bytes=20_000_000, src_worker_id="p"),))  # 1 of 3
    info = svc.registry.get("p")
    assert info is not None  # p registers again (a restarted engine): its next pull to d is a wire-up again
    assert isinstance(svc.handle(b"p", RegisterWorker(request_id="r2", info=info.info,
                                                      protocol_version=PROTOCOL_VERSION)), RegisterAck)
    _beat(svc, (TransferSample(seq=3, seconds=5.0, num_bytes=20_000_000, src_worker_id="p"),))
    text = generate_latest(svc.metrics.registry).decode()
    assert 'splitserve_router_transfer_samples_total{used="no"} 2.0' in text
    assert 'splitserve_router_transfer_samples_total{used="yes"} 1.0' in text


def test_routed_tokens_count_as_queued_until_the_next_report() -> None:
    svc = _router(replace(COST, queue_aware_local=True))
    for _ in range(TOPOLOGY.min_samples):  # fast link: remote is cheaper
        svc.topology.record(Place("c", "z2"), Place("a", "z1"), 20_000_000, 0.03)
    for worker_id in ("p", "d"):  # both count queued tokens: 0 now
        assert svc.handle(worker_id.encode(), Heartbeat(worker_id=worker_id, load=WorkerLoad(num_waiting_tokens=0))) is None
    assert _prefill_worker(svc, _prompt(1)) == "p"
    entry = svc.registry.get("p")
    assert entry is not None and svc.registry.effective_load(entry).num_waiting_tokens == 2000
    # p now has 2,000 tokens queued (2 s) ahead of this prompt: 4.03 s remote vs 3.0 s local.
    assert _prefill_worker(svc, _prompt(2)) is None


def test_local_cheaper_waits_for_the_streams_a_hand_off_brings() -> None:
    """As above, with the default stall cap: the first prompt's hand-off is on its way to d, so the second
    prompt's local prefill (2 s) would stall that stream: it queues behind p instead."""
    svc = _router(replace(COST, queue_aware_local=True), max_stall_s=0.025)
    for _ in range(TOPOLOGY.min_samples):
        svc.topology.record(Place("c", "z2"), Place("a", "z1"), 20_000_000, 0.03)
    for worker_id in ("p", "d"):
        assert svc.handle(worker_id.encode(), Heartbeat(worker_id=worker_id, load=WorkerLoad(num_waiting_tokens=0))) is None
    assert _prefill_worker(svc, _prompt(1)) == "p"
    assert _prefill_worker(svc, _prompt(2)) == "p"


def test_unknown_worker_heartbeat_with_samples_is_still_refused() -> None:
    svc = _router()
    reply = svc.handle(b"x", Heartbeat(worker_id="x", load=WorkerLoad(),
                                       transfers=(TransferSample(seq=1, seconds=1.0, num_bytes=10**6),)))
    assert isinstance(reply, ErrorReply) and reply.code == "not_registered"


def test_a_prefill_workers_push_teaches_the_same_link_as_a_pull() -> None:
    svc = _router()
    # The pair's first push times the wire-up: it teaches nothing.
    wire_up = TransferSample(seq=0, seconds=5.0, num_bytes=20_000_000, src_worker_id="p", dst_worker_id="d")
    assert svc.handle(b"p", Heartbeat(worker_id="p", load=WorkerLoad(), transfers=(wire_up,))) is None
    # p WROTE 2e7 bytes into d's blocks in 0.02 s (its NIXL telemetry, reported on p's heartbeat), 0.01 s of it
    # the cross-zone latency: c -> a at 2e9 bytes/s, the link a pull of the same KV crosses.
    push = TransferSample(seq=1, seconds=0.02, num_bytes=20_000_000, src_worker_id="p", dst_worker_id="d")
    assert svc.handle(b"p", Heartbeat(worker_id="p", load=WorkerLoad(), transfers=(push,))) is None
    # A worker that leaves its own id out is the source all the same; a destination that left teaches nothing.
    unnamed = TransferSample(seq=2, seconds=0.05, num_bytes=20_000_000, dst_worker_id="d")  # 5e8 bytes/s
    gone = TransferSample(seq=3, seconds=1.0, num_bytes=20_000_000, src_worker_id="p", dst_worker_id="gone")
    assert svc.handle(b"p", Heartbeat(worker_id="p", load=WorkerLoad(), transfers=(unnamed, gone))) is None
    assert svc.topology.learned_links() == {}  # two samples: fewer than min_samples
    # A pull d reported (READ from p, 1e9 bytes/s) lands on the same link: the median of 2e9, 5e8 and 1e9.
    _beat(svc, (TransferSample(seq=1, seconds=0.04, num_bytes=30_000_000, src_worker_id="p"),))
    assert svc.topology.learned_links() == {("c", "a"): pytest.approx(1e9)}
    text = generate_latest(svc.metrics.registry).decode()
    assert 'splitserve_router_transfer_samples_total{used="yes"} 3.0' in text
    assert 'splitserve_router_transfer_samples_total{used="no"} 2.0' in text
    gauge = re.search(r'^splitserve_router_link_bandwidth_bytes_per_second\{dst_node="a",src_node="c"\} (\S+)$',
                      text, re.M)
    assert gauge is not None and float(gauge.group(1)) == pytest.approx(1e9)


@pytest.mark.parametrize(("reporter", "src", "dst", "ends"), [
    ("d", "p", "", ("p", "d")),      # a pull d reported: READ from p
    ("d", "", "", None),             # a pull nobody could attribute
    ("p", "p", "d", ("p", "d")),     # a push p reported: WROTE into d
    ("p", "", "d", ("p", "d")),      # a push from a worker that did not name itself
    ("p", "p", "gone", None),        # its destination has left
    ("d", "gone", "", None),         # its source has left
    ("p", "p", "p", None),           # a worker to itself: no link
])
def test_link_ends(reporter: str, src: str, dst: str, ends: tuple[str, str] | None) -> None:
    svc = _router()
    got = link_ends(svc.registry, reporter, TransferSample(seq=1, seconds=1.0, num_bytes=1, src_worker_id=src,
                                                           dst_worker_id=dst))
    assert (None if got is None else (got[0].info.worker_id, got[1].info.worker_id)) == ends
