"""The kv cost sees each worker's queued prefill (its report plus the router's own routes since) and its measured
prefill rate: a hot prefix is replicated once the queue on its worker costs more than recomputing it elsewhere."""

from __future__ import annotations

import random

import pytest

from common.protocol import WorkerInfo, WorkerLoad
from services.router.index import TierOverlap
from services.router.policy import Candidate, Choice, Policy, PolicyConfig, choose_worker, kv_cost, rate_scales
from services.router.registry import Registry

BS = 16
UNIT = PolicyConfig(prefill_weight=1.0, queue_weight=1.0)  # the arithmetic at unit weights


def cand(worker_id: str, queued: int = 0, waiting: int = 0, active: int = 0, rate: float = 0.0) -> Candidate:
    """``queued``: prompt tokens the worker reports waiting (-1: it counts requests only)."""
    return Candidate(worker_id, WorkerLoad(num_waiting=waiting, num_free_blocks=100, num_total_blocks=100,
                                           num_active_blocks=active, num_waiting_tokens=queued,
                                           prefill_tokens_per_s=rate))


def dev(n: int) -> TierOverlap:
    return TierOverlap(n, n, n)


@pytest.mark.parametrize(
    ("candidates", "block_size", "config", "expected"),
    [
        pytest.param(  # a holds the prompt, 6 blocks queued (96 tokens): 6 < b's 10 to compute
            [cand("a", queued=96), cand("b")], BS, UNIT, Choice("a", 6.0, 10.0, "lowest_cost", 10.0),
            id="short-queue-keeps-prefix"),
        pytest.param(  # 12 blocks queued on a: recomputing the prompt on idle b is sooner
            [cand("a", queued=192), cand("b")], BS, UNIT, Choice("b", 10.0, 0.0, "lowest_cost", 10.0),
            id="long-queue-replicates"),
        pytest.param(  # queue_weight 0.25: those 12 blocks weigh 3
            [cand("a", queued=192), cand("b")], BS, PolicyConfig(prefill_weight=1.0, queue_weight=0.25),
            Choice("a", 3.0, 10.0, "lowest_cost", 10.0), id="queue-weight"),
        pytest.param(  # queue_weight 0: the cost of blocks alone, as before
            [cand("a", queued=192), cand("b")], BS, PolicyConfig(prefill_weight=1.0, queue_weight=0.0),
            Choice("a", 0.0, 10.0, "lowest_cost", 10.0), id="queue-weight-0"),
        pytest.param(  # a caller that knows no block size prices no queue
            [cand("a", queued=192), cand("b")], 0, UNIT, Choice("a", 0.0, 10.0, "lowest_cost", 10.0),
            id="no-block-size"),
        pytest.param(  # an engine that counts requests only: 1 waiting = 1,024 tokens = 64 blocks
            [cand("a", queued=-1, waiting=1), cand("b")], BS, UNIT, Choice("b", 10.0, 0.0, "lowest_cost", 10.0),
            id="requests-only-engine"),
        pytest.param(  # default weights: 16 * (0 + 0.25 * 12) = 48 < 16 * 10 = 160
            [cand("a", queued=192), cand("b")], BS, PolicyConfig(), Choice("a", 48.0, 10.0, "lowest_cost", 10.0),
            id="defaults-keep"),
        pytest.param(  # default weights: 16 * 0.25 * 48 = 192 > 160
            [cand("a", queued=768), cand("b")], BS, PolicyConfig(), Choice("b", 160.0, 0.0, "lowest_cost", 10.0),
            id="defaults-replicate"),
        pytest.param(  # nobody holds it: b's queue tips it; both measured the same rate
            [cand("a", queued=32, rate=4000.0), cand("b", queued=48, rate=4000.0)], BS, UNIT,
            Choice("a", 12.0, 0.0, "lowest_cost", 0.0), id="cold-least-queue"),
    ],
)
def test_queue_in_the_cost(candidates, block_size, config, expected) -> None:
    overlaps = {"a": dev(10)} if expected.best_overlap_blocks else {}
    assert choose_worker(candidates, overlaps, 10, config, random.Random(0), 0, block_size) == expected


def test_kv_cost_with_queue_matches_choice() -> None:
    load = WorkerLoad(num_active_blocks=7, num_waiting_tokens=64)  # 4 blocks queued
    assert kv_cost(load, dev(6), 10, UNIT, BS) == (15.0, 6.0)  # 4 to compute + 4 queued + 7
    assert kv_cost(load, dev(6), 10, UNIT) == (11.0, 6.0)  # no block size: no queue


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ([0.0, 0.0], None),  # nobody measured: all alike
        ([2000.0, 2100.0, 1900.0], [1.0, 1.0, 1.0]),  # within the jitter band of the median
        ([4000.0, 2000.0, 2000.0], [0.5, 1.0, 1.0]),  # twice the median rate: half the cost
        ([1000.0, 2000.0, 0.0], [1.5, 0.75, 1.0]),  # median 1,500; the unmeasured one is taken at it
    ],
)
def test_rate_scales(rates: list[float], expected: list[float] | None) -> None:
    assert rate_scales([WorkerLoad(prefill_tokens_per_s=r) for r in rates]) == expected


def test_faster_worker_wins_a_cold_prompt() -> None:
    # Same queue and load: b would win the tie on id order after a; a is half as fast as the median.
    candidates = [cand("a", rate=1000.0), cand("b", rate=2000.0), cand("c", rate=2000.0)]
    choice = choose_worker(candidates, {}, 10, UNIT, random.Random(0), 0, BS)
    assert (choice.worker_id, choice.cost) == ("b", 10.0)
    slow_only = choose_worker(candidates[:1], {}, 10, UNIT, random.Random(0), 0, BS)
    assert slow_only.cost == 10.0  # alone it is its own median


def _registry() -> Registry:
    registry = Registry()
    for wid in ("hot", "cold"):
        registry.register(WorkerInfo(worker_id=wid, role="both", model="m", block_size=BS, num_blocks=100,
                                     endpoint="tcp://127.0.0.1:1", kv_events=True), now_s=0.0)
        registry.report(wid, WorkerLoad(num_free_blocks=100, num_total_blocks=100, num_waiting_tokens=0), now_s=1.0)
    return registry


def test_routes_since_the_last_report_count_as_queue() -> None:
    """A burst on the prompt's worker: the router's own routes (in no report yet) fill its queue, and once they
    outweigh recomputing, the next request goes to the other worker. The next report replaces the guess."""
    registry, policy = _registry(), Policy(UNIT)
    hashes = list(range(10))  # 10 full blocks of which "hot" holds 9: 1 block (16 tokens) to compute there

    def route() -> str:
        candidates = [Candidate(e.info.worker_id, registry.effective_load(e)) for e in registry.workers()]
        choice = policy.choose_route(hashes, 10 * BS, BS, candidates, [], {"hot": dev(9)})
        registry.note_routed(choice.decode_worker_id, 10 * BS - choice.num_cached_tokens_predicted)
        return choice.decode_worker_id

    # hot costs 1 + k blocks after k routes (16 tokens each queued), cold 10: the 10th ties and goes to the
    # less loaded worker.
    assert [route() for _ in range(10)] == ["hot"] * 9 + ["cold"]
    registry.report("hot", WorkerLoad(num_free_blocks=100, num_total_blocks=100, num_waiting_tokens=0), now_s=2.0)
    assert route() == "hot"  # its queue drained: back to the prefix
