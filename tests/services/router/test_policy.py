"""Routing decisions, table-driven with exact expectations (docs/architecture.md#a-requests-path, #contracts)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from common.errors import NoWorkerError
from common.protocol import WorkerLoad
from services.router.cost import CostConfig
from services.router.index import TierOverlap
from services.router.policy import (
    Candidate,
    Choice,
    Policy,
    PolicyConfig,
    PrefillDecision,
    RouteChoice,
    choose_worker,
    decide_prefill,
    kv_cost,
)
from services.router.tier_credit import TierConfig

BS = 16


def cand(worker_id: str, active: int = 0, running: int = 0, waiting: int = 0, free: int = 100,
         total: int = 100) -> Candidate:
    load = WorkerLoad(num_running=running, num_waiting=waiting, num_free_blocks=free, num_total_blocks=total,
                      num_active_blocks=active)
    return Candidate(worker_id, load)


def dev(n: int) -> TierOverlap:
    return TierOverlap(n, n, n)


KV = PolicyConfig(prefill_weight=1.0)  # the cost formula's arithmetic at unit weight (the default is tuned)
# Tier speeds in powers of two, no latency: a host block saves 0.75 of a block's compute, a disk block 0.5, at the
# workers' 1,024 tokens/s (none measured) and 1,024 KV bytes per token (services/router/tier_credit.py).
TIERED = PolicyConfig(prefill_weight=1.0, cost=CostConfig(prefill_tokens_per_s=1024.0, kv_bytes_per_token=1024),
                      tiers=TierConfig(host_bytes_per_s=4 * 2**20, disk_bytes_per_s=2 * 2**20, host_latency_s=0.0,
                                       disk_latency_s=0.0))
SLOW_DISK = PolicyConfig(prefill_weight=1.0, cost=TIERED.cost, tiers=TierConfig(disk_bytes_per_s=2**19))


@pytest.mark.parametrize(
    ("candidates", "overlaps", "blocks", "config", "expected"),
    [
        pytest.param(  # a: 2 to compute + 10 active = 12; b: 10 + 0 = 10
            [cand("a", active=10), cand("b")], {"a": dev(8)}, 10, KV,
            Choice("b", 10.0, 0.0, "lowest_cost", 8.0), id="cost-prefill-vs-decode"),
        pytest.param(  # a: credit 2 + 0.75*4 + 0.5*4 = 7 -> cost 3; b: credit 5 -> cost 5
            [cand("a"), cand("b")], {"a": TierOverlap(2, 6, 10), "b": dev(5)}, 10, TIERED,
            Choice("a", 3.0, 7.0, "lowest_cost", 7.0), id="host-disk-credit"),
        pytest.param(  # overlap beyond the request's blocks: prefill term floors at 0
            [cand("a", active=3), cand("b", active=4)], {"a": dev(12), "b": dev(12)}, 10, KV,
            Choice("a", 3.0, 12.0, "lowest_cost", 12.0), id="credit-floor"),
        pytest.param(  # equal cost: lower load (running + waiting) wins
            [cand("a", running=2), cand("b", running=1)], {}, 4, KV,
            Choice("b", 4.0, 0.0, "lowest_cost", 0.0), id="tie-load"),
        pytest.param(  # equal cost and load: lowest id, whatever the input order
            [cand("c"), cand("b"), cand("a2")], {}, 4, KV,
            Choice("a2", 4.0, 0.0, "lowest_cost", 0.0), id="tie-id"),
        pytest.param(  # a has the prefix but 98% of its blocks are in use: skipped
            [cand("a", free=2), cand("b")], {"a": dev(10)}, 10, KV,
            Choice("b", 10.0, 0.0, "lowest_cost", 0.0), id="busy-skipped"),
        pytest.param(  # exactly at the threshold is not busy (above it is)
            [cand("a", free=5), cand("b")], {"a": dev(10)}, 10, KV,
            Choice("a", 0.0, 10.0, "lowest_cost", 10.0), id="at-threshold"),
        pytest.param(  # all busy: nobody skipped, flagged
            [cand("a", free=2), cand("b", free=1)], {"a": dev(10)}, 10, KV,
            Choice("a", 0.0, 10.0, "lowest_cost", 10.0, all_busy=True), id="all-busy"),
        pytest.param(  # no capacity reported yet: never busy
            [cand("a", free=0, total=0)], {}, 3, KV,
            Choice("a", 3.0, 0.0, "lowest_cost", 0.0), id="no-capacity-figure"),
        pytest.param(  # prefill_weight 0: load only
            [cand("a", active=5), cand("b", active=1)], {"a": dev(10)}, 10, PolicyConfig(prefill_weight=0.0),
            Choice("b", 1.0, 0.0, "lowest_cost", 10.0), id="weight-0"),
        pytest.param(  # a disk that loads slower than the worker computes earns nothing: b's 3 device blocks win
            [cand("a"), cand("b")], {"a": TierOverlap(0, 0, 8), "b": dev(3)}, 10, SLOW_DISK,
            Choice("b", 7.0, 3.0, "lowest_cost", 3.0), id="slow-disk-no-credit"),
        pytest.param(  # least-loaded ignores overlap; ties on requests broken by active blocks
            [cand("a", running=1, active=9), cand("b", running=1, active=3), cand("c", running=3)],
            {"a": dev(10)}, 10, PolicyConfig(policy="least-loaded", prefill_weight=1.0),
            Choice("b", 13.0, 0.0, "least_loaded", 10.0), id="least-loaded"),
        pytest.param(
            [cand("a", free=0), cand("b", waiting=9), cand("c", waiting=4)], {}, 1,
            PolicyConfig(policy="least-loaded", prefill_weight=1.0),
            Choice("c", 1.0, 0.0, "least_loaded", 0.0), id="least-loaded-skips-busy"),
    ],
)
def test_choose_worker(candidates, overlaps, blocks, config, expected) -> None:
    assert choose_worker(candidates, overlaps, blocks, config, random.Random(0), 0) == expected


def test_kv_cost_matches_choice() -> None:
    load = WorkerLoad(num_active_blocks=7)
    overlap = TierOverlap(2, 6, 10)  # credit 2 + 0.75 * 4 + 0.5 * 4 = 7
    assert kv_cost(load, overlap, 10, TIERED) == (10.0, 7.0)
    assert kv_cost(load, overlap, 10, PolicyConfig(prefill_weight=2.0, cost=TIERED.cost, tiers=TIERED.tiers)) == (
        13.0, 7.0)
    choice = choose_worker([Candidate("a", load)], {"a": overlap}, 10, TIERED, random.Random(0), 0)
    assert (choice.cost, choice.overlap_blocks) == kv_cost(load, overlap, 10, TIERED)


@pytest.mark.parametrize(("rr_index", "expected"), [(0, "a"), (1, "b"), (2, "c"), (3, "a"), (7, "b")])
def test_round_robin_sorted_by_id(rr_index: int, expected: str) -> None:
    candidates = [cand("c"), cand("a"), cand("b")]
    choice = choose_worker(candidates, {}, 4, PolicyConfig(policy="round-robin"), random.Random(0), rr_index)
    assert (choice.worker_id, choice.reason) == (expected, "round_robin")


def test_round_robin_skips_busy() -> None:
    candidates = [cand("a"), cand("b", free=0), cand("c")]
    picks = [choose_worker(candidates, {}, 4, PolicyConfig(policy="round-robin"), random.Random(0), i).worker_id
             for i in range(4)]
    assert picks == ["a", "c", "a", "c"]


def test_random_uses_rng() -> None:
    # random.Random(0).randrange(3) == 1 -> the second worker by id.
    choice = choose_worker([cand("c"), cand("a"), cand("b")], {}, 4, PolicyConfig(policy="random"),
                           random.Random(0), 0)
    assert (choice.worker_id, choice.reason) == ("b", "random")


def test_temperature_prefers_low_cost_and_is_reproducible() -> None:
    config = PolicyConfig(temperature=0.5)
    candidates = [cand("a"), cand("b"), cand("c")]
    overlaps = {"a": dev(10), "b": dev(5)}  # costs 0, 5, 10
    rng = random.Random(42)
    picks = Counter(choose_worker(candidates, overlaps, 10, config, rng, 0).worker_id for _ in range(3000))
    assert picks["a"] > picks["b"] > picks["c"] > 0
    again = random.Random(42)
    first = [choose_worker(candidates, overlaps, 10, config, again, 0).worker_id for _ in range(20)]
    rng = random.Random(42)
    assert first == [choose_worker(candidates, overlaps, 10, config, rng, 0).worker_id for _ in range(20)]
    assert choose_worker(candidates, overlaps, 10, config, random.Random(0), 0).reason == "sampled"


def test_temperature_with_equal_zero_costs() -> None:
    choice = choose_worker([cand("a"), cand("b")], {"a": dev(4), "b": dev(4)}, 4, PolicyConfig(temperature=1.0),
                           random.Random(0), 0)
    assert choice.cost == 0.0 and choice.worker_id in ("a", "b")


def test_choose_worker_needs_candidates() -> None:
    with pytest.raises(NoWorkerError):
        choose_worker([], {}, 1, KV, random.Random(0), 0)


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        PolicyConfig(policy="fastest")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PolicyConfig(temperature=-1.0)


POOL = [cand("p1", waiting=2), cand("p2", waiting=9)]


@pytest.mark.parametrize(
    ("prompt", "cached", "pool", "expected", "stall_s"),
    [
        (4000, 0, [], PrefillDecision(False, "no_prefill_pool"), 0.0),
        (256, 0, POOL, PrefillDecision(False, "short_uncached"), 0.0),  # at the limit: local
        (257, 0, POOL, PrefillDecision(True, "remote"), 0.0),
        (1000, 800, POOL, PrefillDecision(False, "short_uncached"), 0.0),  # 200 uncached
        (1000, 700, POOL, PrefillDecision(True, "remote"), 0.0),
        (4000, 0, [cand("p1", waiting=8), cand("p2", waiting=9)], PrefillDecision(False, "prefill_saturated"), 0.0),
        (4000, 0, [cand("p1", waiting=7), cand("p2", waiting=9)], PrefillDecision(True, "remote"), 0.0),
        (100, 0, [cand("p1", waiting=8)], PrefillDecision(False, "short_uncached"), 0.0),  # short before saturated
        # A decode worker with streams: short prompts go local only while the stall fits (default 25 ms).
        (100, 0, POOL, PrefillDecision(False, "short_uncached"), 0.025),
        (100, 0, POOL, PrefillDecision(True, "remote"), 0.026),
        (100, 0, [cand("p1", waiting=8)], PrefillDecision(False, "prefill_saturated"), 0.5),  # no room remotely
    ],
)
def test_decide_prefill(prompt: int, cached: int, pool: list[Candidate], expected: PrefillDecision,
                        stall_s: float) -> None:
    assert decide_prefill(prompt, cached, pool, KV, stall_s) == expected


@pytest.mark.parametrize(
    ("running", "waiting", "handoffs", "rate", "uncached", "expected_s"),
    [
        (0, 0, 0, 0.0, 64, 0.0),  # no streams to stall
        (2, 0, 0, 0.0, 64, 0.032),  # the default rate, 2,000 tokens/s
        (0, 1, 0, 0.0, 64, 0.032),  # routed since the last report: streaming soon
        (0, 0, 1, 0.0, 64, 0.032),  # a hand-off on its way, in no report yet: streaming soon
        (1, 0, 0, 640.0, 64, 0.1),  # the worker's measured rate
    ],
)
def test_predicted_stall_s(running: int, waiting: int, handoffs: int, rate: float, uncached: int,
                           expected_s: float) -> None:
    from services.router.cost import Site
    from services.router.cost import predicted_stall_s

    load = WorkerLoad(num_running=running, num_waiting=waiting, prefill_tokens_per_s=rate)
    site = Site("d1", load, num_cached_tokens=1536, num_handoffs_due=handoffs)
    assert predicted_stall_s(1536 + uncached, site, CostConfig()) == pytest.approx(expected_s)


def test_route_streaming_decode_worker_sends_a_short_suffix_remote() -> None:
    # The shared-prefix case: 1,536 tokens cached on the decode worker, a 64-token suffix. Idle, it prefills there
    # (no stream to stall); with 2 streams and a measured 640 tokens/s the 100 ms stall goes remote instead.
    prompt = 1600
    overlaps = {"d1": dev(1536 // BS), "p1": dev(1536 // BS)}
    idle = route(Policy(PolicyConfig()), prompt, [cand("d1")], [cand("p1")], overlaps)
    assert summary(idle) == ("d1", None, 1536, "short_uncached")
    streaming = Candidate("d1", WorkerLoad(num_running=2, num_free_blocks=100, num_total_blocks=100,
                                           prefill_tokens_per_s=640.0))
    busy = route(Policy(PolicyConfig()), prompt, [streaming], [cand("p1")], overlaps)
    assert summary(busy) == ("d1", "p1", 1536, "remote")
    assert summary(route(Policy(PolicyConfig(local_prefill_max_stall_s=float("inf"))), prompt, [streaming],
                         [cand("p1")], overlaps)) == ("d1", None, 1536, "short_uncached")



def test_the_local_decision_reads_what_the_decode_worker_holds_not_what_is_on_its_way() -> None:
    # overlaps credit d1 with a prefix routed to it a moment ago (pending); held says it has none of it yet.
    prompt = 1600
    overlaps = {"d1": dev(1536 // BS), "p1": dev(1536 // BS)}
    choice = Policy(PolicyConfig()).choose_route(HASHES[: prompt // BS], prompt, BS, [cand("d1")], [cand("p1")],
                                                overlaps, held={"p1": dev(1536 // BS)})
    assert summary(choice) == ("d1", "p1", 1536, "remote")
    # Without ``held`` the pending credit counts: the 64-token suffix runs on the (idle) decode worker.
    assert summary(route(Policy(PolicyConfig()), prompt, [cand("d1")], [cand("p1")], overlaps)) == \
        ("d1", None, 1536, "short_uncached")


HASHES = list(range(1000, 1250))  # 250 full blocks = a 4,000-token prompt


def summary(choice: RouteChoice) -> tuple:
    return (choice.decode_worker_id, choice.prefill_worker_id, choice.num_cached_tokens_predicted, choice.reason)


def route(policy: Policy, prompt_tokens: int, decode, prefill, overlaps) -> RouteChoice:
    return policy.choose_route(HASHES[: prompt_tokens // BS], prompt_tokens, BS, decode, prefill, overlaps)


def test_route_aggregated() -> None:
    choice = route(Policy(KV), 4000, [cand("w1", active=50), cand("w2")], [], {"w1": dev(100)})
    # w1: 150 to compute + 50 active = 200; w2: 250.
    assert summary(choice) == (
        "w1", None, 1600, "no_prefill_pool")
    assert choice.decode == Choice("w1", 200.0, 100.0, "lowest_cost", 100.0)
    assert choice.prefill is None


def test_route_remote_prefill_on_best_prefill_worker() -> None:
    overlaps = {"p2": TierOverlap(100, 150, 150), "d1": dev(3)}
    choice = route(Policy(TIERED), 4000, [cand("d1"), cand("d2", active=1)], [cand("p1"), cand("p2")], overlaps)
    assert summary(choice) == (
        "d1", "p2", 150 * BS, "remote")
    assert choice.prefill == Choice("p2", 250 - 137.5, 137.5, "lowest_cost", 137.5)  # 100 + 0.75 * 50 host blocks


def test_route_short_uncached_stays_local() -> None:
    # d1 holds 240 of 250 blocks: 160 uncached tokens <= 256.
    choice = route(Policy(KV), 4000, [cand("d1"), cand("d2")], [cand("p1")], {"d1": dev(240)})
    assert summary(choice) == (
        "d1", None, 3840, "short_uncached")


def test_route_saturated_pool_stays_local() -> None:
    choice = route(Policy(KV), 4000, [cand("d1")], [cand("p1", waiting=8), cand("p2", waiting=20)], {})
    assert (choice.prefill_worker_id, choice.reason) == (None, "prefill_saturated")


@pytest.mark.parametrize(("decode", "expected"), [
    # d1 idle: 4,000 tokens at 2,000/s (2.0 s) against p1's 2 waiting prompts (2,048 tokens) and the prompt there
    # (3.02 s): d1 prefills it.
    (cand("d1"), (None, "idle_decode")),
    # d1 streams: a local prefill would stall it, so the prompt waits at p1.
    (cand("d1", running=1), ("p1", "remote")),
])
def test_idle_decode_worker_takes_a_prompt_off_a_busy_prefill_pool(decode: Candidate, expected: tuple) -> None:
    choice = route(Policy(PolicyConfig()), 4000, [decode], [cand("p1", waiting=2)], {})
    assert (choice.prefill_worker_id, choice.reason) == expected


def test_route_skips_full_prefill_queue() -> None:
    # p1 has the prefix but its queue is full; p2 has room (d1 streams: it takes no prompt off a busy pool).
    overlaps = {"p1": dev(250)}
    choice = route(Policy(KV), 4000, [cand("d1", running=1)], [cand("p1", waiting=8), cand("p2", waiting=1)],
                   overlaps)
    assert (choice.prefill_worker_id, choice.num_cached_tokens_predicted) == ("p2", 0)


def test_route_both_worker_is_not_its_own_remote_prefill() -> None:
    both = cand("b1")
    choice = route(Policy(KV), 4000, [both], [both], {})
    assert (choice.decode_worker_id, choice.prefill_worker_id, choice.reason) == ("b1", None, "no_prefill_pool")
    choice = route(Policy(KV), 4000, [both], [both, cand("p1")], {})
    assert (choice.decode_worker_id, choice.prefill_worker_id) == ("b1", "p1")


def test_route_prices_an_unmeasured_decode_worker_at_its_peers_rate() -> None:
    # The prefill worker measured 1,270 tokens/s; the decode worker none (it never prefills). At the default
    # 2,000 tokens/s, 2,048 tokens local cost 1.02 * 1.5 = 1.54 s < 1.61 s remote: every prompt went local and
    # stalled the decode streams. At the peer's rate local is 2.42 s: remote.
    policy = Policy(PolicyConfig(cost=CostConfig(prefill_tokens_per_s=2000.0)))
    prefill = Candidate("p1", WorkerLoad(num_free_blocks=100, num_total_blocks=100, num_waiting_tokens=0,
                                         prefill_tokens_per_s=1270.0))
    decode = Candidate("d1", WorkerLoad(num_free_blocks=100, num_total_blocks=100, num_waiting_tokens=0))
    choice = route(policy, 2048, [decode], [prefill], {})
    assert (choice.prefill_worker_id, choice.reason) == ("p1", "remote")


def test_route_partial_block_counts_as_work() -> None:
    # 20 tokens: 1 full block hashed, 2 blocks of work. Fully cached full block -> cost 1 on w1.
    choice = Policy(KV).choose_route(HASHES[:1], 20, BS, [cand("w1"), cand("w2")], [], {"w1": dev(1)})
    assert (choice.decode.cost, choice.num_cached_tokens_predicted) == (1.0, 16)


def test_route_round_robin_counters_independent() -> None:
    policy = Policy(PolicyConfig(policy="round-robin"))
    decode = [cand("d1"), cand("d2"), cand("d3")]
    prefill = [cand("p1"), cand("p2")]
    picks = [(c.decode_worker_id, c.prefill_worker_id) for c in (route(policy, 4000, decode, prefill, {})
                                                                 for _ in range(4))]
    assert picks == [("d1", "p1"), ("d2", "p2"), ("d3", "p1"), ("d1", "p2")]


def test_route_random_is_seeded() -> None:
    decode = [cand(f"d{i}") for i in range(8)]
    config = PolicyConfig(policy="random")
    policy_a, policy_b = Policy(config, seed=7), Policy(config, seed=7)
    seq_a = [route(policy_a, 4000, decode, [], {}).decode_worker_id for _ in range(10)]
    seq_b = [route(policy_b, 4000, decode, [], {}).decode_worker_id for _ in range(10)]
    assert seq_a == seq_b and len(set(seq_a)) > 1


def test_route_needs_decode_worker() -> None:
    with pytest.raises(NoWorkerError):
        route(Policy(KV), 4000, [], [cand("p1")], {})
