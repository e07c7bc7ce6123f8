"""The kv policy's tuned defaults keep a shared prefix on the worker that holds it (bench/routing.py).

Two failures the routing benchmark found: (1) at prefill_weight 1 one more decoding request (whose active
blocks count its whole context) outweighed a cached 2,000-token prefix, so kv routing spread every prefix
like least-loaded; (2) requests for a prefix arriving while its first prefill ran saw no overlap anywhere
(its KV events come after the prefill) and were spread too, each recomputing it.
"""

from __future__ import annotations

import random

from common.hashing import block_hashes
from common.protocol import (
    BlockStored,
    Heartbeat,
    KvEvents,
    PROTOCOL_VERSION,
    KvSnapshot,
    RegisterAck,
    RegisterWorker,
    Route,
    RouteRequest,
    WorkerInfo,
    WorkerLoad,
)
from services.router.index import TierOverlap
from services.router.policy import Candidate, PolicyConfig, choose_worker
from services.router.service import RouterConfig, RouterService

BS = 32


def test_default_keeps_a_cached_prefix_over_one_more_request() -> None:
    # 2,050-token prompt: 65 blocks, 62 of them cached on a; a already decodes one such request.
    busy_with_prefix = Candidate("a", WorkerLoad(num_running=1, num_free_blocks=200, num_total_blocks=296,
                                                 num_active_blocks=65))
    idle = Candidate("b", WorkerLoad(num_free_blocks=296, num_total_blocks=296))
    overlaps = {"a": TierOverlap(62, 62, 62)}
    assert choose_worker([busy_with_prefix, idle], overlaps, 65, PolicyConfig(), random.Random(0), 0).worker_id == "a"
    # Unit weight (the old default) gave it away: 3 + 65 > 65.
    assert choose_worker([busy_with_prefix, idle], overlaps, 65, PolicyConfig(prefill_weight=1.0),
                         random.Random(0), 0).worker_id == "b"


def test_default_still_balances_when_the_prefix_worker_is_far_busier() -> None:
    loaded = Candidate("a", WorkerLoad(num_running=20, num_free_blocks=100, num_total_blocks=2000,
                                       num_active_blocks=20 * 65))
    idle = Candidate("b", WorkerLoad(num_free_blocks=2000, num_total_blocks=2000))
    overlaps = {"a": TierOverlap(62, 62, 62)}
    assert choose_worker([loaded, idle], overlaps, 65, PolicyConfig(), random.Random(0), 0).worker_id == "b"


def _router(pending_ttl_s: float) -> RouterService:
    svc = RouterService(RouterConfig(pending_ttl_s=pending_ttl_s))
    svc.events_endpoint = "tcp://127.0.0.1:9"
    for i in range(4):
        info = WorkerInfo(worker_id=f"w{i}", role="both", model="m", block_size=BS, num_blocks=296,
                          endpoint=f"tcp://127.0.0.1:1{i}", kv_events=True)
        assert isinstance(svc.handle(f"w{i}".encode(), RegisterWorker(request_id=f"r{i}", info=info,
                                                                 protocol_version=PROTOCOL_VERSION)), RegisterAck)
        # Its answer to the snapshot the router asks for on registration (an empty cache).
        assert svc.handle(f"w{i}".encode(), KvSnapshot(request_id=f"s{i}", worker_id=f"w{i}", event_id=-1,
                                                       tier_blocks=())) is None
    return svc


def _route(svc: RouterService, tokens: list[int]) -> str:
    reply = svc.handle(b"frontend", RouteRequest(request_id="q", model="m", token_ids=tuple(tokens)))
    assert isinstance(reply, Route)
    return reply.decode.worker_id


def test_pending_prefix_keeps_a_burst_on_one_worker() -> None:
    rng = random.Random(0)
    prefix = [rng.randrange(10, 8000) for _ in range(2000)]
    burst = [prefix + [rng.randrange(10, 8000) for _ in range(50)] for _ in range(4)]
    svc = _router(pending_ttl_s=3.0)
    chosen = {_route(svc, prompt) for prompt in burst}  # no KV event has arrived yet
    assert len(chosen) == 1
    (worker,) = chosen
    # The pending run covers the prefix's full blocks on that worker only.
    hashes = block_hashes(burst[0], BS, svc.registry.get(worker).info.hash_seed)
    assert svc._overlaps(hashes)[worker].device >= 2000 // BS
    # Without it, the burst is spread (every worker looks equally cold) and the prefix computed 4 times.
    svc = _router(pending_ttl_s=0.0)
    assert len({_route(svc, prompt) for prompt in burst}) == 4


def test_pending_run_covers_the_prompt_and_is_forgotten_on_reregistration() -> None:
    svc = _router(pending_ttl_s=3.0)
    rng = random.Random(1)
    prompt = [rng.randrange(10, 8000) for _ in range(320)]
    worker = _route(svc, prompt)
    hashes = block_hashes(prompt, BS, svc.registry.get(worker).info.hash_seed)
    assert svc._overlaps(hashes)[worker] == TierOverlap(10, 10, 10)
    svc.handle(worker.encode(), RegisterWorker(request_id="again", info=svc.registry.get(worker).info,
                                                         protocol_version=PROTOCOL_VERSION))
    assert worker not in svc._overlaps(hashes)  # re-registration forgets pending blocks too


def _pd_router() -> RouterService:
    svc = RouterService(RouterConfig(pending_ttl_s=3.0))
    svc.events_endpoint = "tcp://127.0.0.1:9"
    for i, role in enumerate(("prefill", "decode")):
        info = WorkerInfo(worker_id=role, role=role, model="m", block_size=BS, num_blocks=296,
                          endpoint=f"tcp://127.0.0.1:1{i}", kv_events=True)
        assert isinstance(svc.handle(role.encode(), RegisterWorker(request_id=f"r{i}", info=info,
                                                                  protocol_version=PROTOCOL_VERSION)), RegisterAck)
        assert svc.handle(role.encode(), KvSnapshot(request_id=f"s{i}", worker_id=role, event_id=-1,
                                                    tier_blocks=())) is None
    return svc


def _route_pd(svc: RouterService, tokens: list[int]) -> tuple[str, str | None]:
    reply = svc.handle(b"frontend", RouteRequest(request_id="q", model="m", token_ids=tuple(tokens)))
    assert isinstance(reply, Route)
    return reply.decode.worker_id, reply.prefill.worker_id if reply.prefill else None


def test_a_prefix_still_on_its_way_to_the_decode_worker_is_not_prefilled_there() -> None:
    # Two requests of one 1,024-token prefix, 0.9 s apart: the first is prefilled remotely; its KV reaches the
    # decode worker seconds later. The second must not be prefilled on the decode worker on the pending credit
    # (it would compute all 1,088 tokens there, stalling every stream: peers run of 2026-12-06).
    rng = random.Random(2)
    prefix = [rng.randrange(10, 8000) for _ in range(1024)]
    first, second = (prefix + [rng.randrange(10, 8000) for _ in range(64)] for _ in range(2))
    svc = _pd_router()
    idle = Heartbeat(worker_id="decode", load=WorkerLoad(num_free_blocks=296, num_total_blocks=296), seq=1)
    assert _route_pd(svc, first) == ("decode", "prefill")
    svc.handle(b"decode", idle)  # the decode worker reports in while the first prompt is still being prefilled
    assert _route_pd(svc, second) == ("decode", "prefill")
    # The first request's KV arrives (the decode worker's events store its blocks, the prefix among them); the
    # second's is still on its way, in no report: a local prefill would stall the stream about to start there.
    seed = svc.registry.get("decode").info.hash_seed
    hashes = block_hashes(prefix, BS, seed)
    svc._identities.setdefault("decode", b"decode")
    svc._apply_events(KvEvents(worker_id="decode", event_id=0, events=(
        BlockStored(block_hashes=tuple(block_hashes(first, BS, seed)), parent_hash=None, tier="device"),)))
    assert svc._overlaps(hashes, pending=False)["decode"].device == len(hashes)
    svc.handle(b"decode", Heartbeat(worker_id="decode", load=idle.load, seq=2))
    third = prefix + [rng.randrange(10, 8000) for _ in range(64)]
    assert _route_pd(svc, third) == ("decode", "prefill")
    # Once every hand-off has arrived and the load report says they have finished, a short suffix runs there.
    svc._apply_events(KvEvents(worker_id="decode", event_id=1, events=(
        BlockStored(block_hashes=tuple(block_hashes(second, BS, seed)[-2:]), parent_hash=hashes[-1], tier="device"),
        BlockStored(block_hashes=tuple(block_hashes(third, BS, seed)[-2:]), parent_hash=hashes[-1], tier="device"))))
    svc.handle(b"decode", Heartbeat(worker_id="decode", load=idle.load, seq=3))
    fourth = prefix + [rng.randrange(10, 8000) for _ in range(64)]
    assert _route_pd(svc, fourth) == ("decode", None)
