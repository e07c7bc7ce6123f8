"""Local vs remote prefill and the (prefill, decode) pair, in predicted seconds: exact expectations.

Figures used below: rate 1,000 tokens/s, local factor 1.5, a 2,000-token prompt. Remote compute 2.0 s,
local 3.0 s. KV 1,000 bytes/token (2e6 bytes): same node 0.002 + 0.001 s, same zone 0.02 + 0.002 s, other
zone 0.2 + 0.01 s. At 10,000 bytes/token (2e7 bytes): same zone 0.2 + 0.002 s, other zone 2.0 + 0.01 s.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from common.protocol import WorkerLoad
from common.timing import TimingModel
from services.router.cost import (
    CostConfig,
    PairChoice,
    PrefillChoice,
    Site,
    choose_pair,
    choose_prefill,
    queued_tokens,
    typical_rate,
)
from services.router.topology import Place, Topology, TopologyConfig

TOPOLOGY = TopologyConfig(same_node_bytes_per_s=1e9, same_zone_bytes_per_s=1e8, cross_zone_bytes_per_s=1e7,
                          same_node_latency_s=0.001, same_zone_latency_s=0.002, cross_zone_latency_s=0.01,
                          min_sample_bytes=1000, min_samples=1)  # a table case's one sample is the link
CONFIG = CostConfig(prefill_tokens_per_s=1000.0, local_prefill_factor=1.5, decode_interference_per_stream=0.1,
                    equal_tolerance=0.05, topology=TOPOLOGY)
PROMPT = 2000
IDLE = WorkerLoad(num_waiting_tokens=0)
A1, B1, C2 = Place("a", "z1"), Place("b", "z1"), Place("c", "z2")


def site(worker_id: str, place: Place, kv: int = 1000, cached: int = 0, load: WorkerLoad = IDLE) -> Site:
    return Site(worker_id, load, place, kv, cached)


def same(actual: PrefillChoice | PairChoice, expected: PrefillChoice | PairChoice) -> bool:
    """Equal, floats to 1e-6 relative (the seconds are sums of decimals)."""
    if isinstance(actual, PairChoice) and isinstance(expected, PairChoice):
        return actual.decode_worker_id == expected.decode_worker_id and same(actual.prefill, expected.prefill)
    return asdict(actual) == pytest.approx(asdict(expected))


DECODE_A = site("d", A1)
DECODE_A_BIG = site("d", A1, kv=10_000)
LEARNED_FAST_CROSS = [(C2, A1, 20_000_000, 0.03)]  # 2e7 bytes in 0.02 s + 0.01 s latency: 1e9 bytes/s
LEARNED_SLOW_SAME_ZONE = [(B1, A1, 20_000_000, 2.002)]  # 1e7 bytes/s on a link priced at 1e8


@pytest.mark.parametrize(
    ("decode", "prefill", "samples", "expected"),
    [
        pytest.param(DECODE_A, [], [], PrefillChoice(None, 3.0, "no_remote", 3.0), id="no-prefill-worker"),
        # Same node 2.003 s; same zone 1.95 + 0.022 = 1.972 s, faster but within 5%: the closer one wins.
        pytest.param(DECODE_A, [site("far", B1, cached=50), site("near", A1)], [],
                     PrefillChoice("near", 2.003, "remote", 3.0, "same_node", 0.003), id="same-node-when-equal"),
        # Same zone 1.972 s vs other zone 1.95 + 0.21 = 2.16 s (same cache): not equal, the faster.
        pytest.param(DECODE_A, [site("z2", C2, cached=50), site("z1", B1, cached=50)], [],
                     PrefillChoice("z1", 1.972, "remote", 3.0, "same_zone", 0.022), id="same-zone-when-faster"),
        # 1.0 + 0.022 = 1.022 s vs 2.003 s: far beyond the tolerance, locality does not matter.
        pytest.param(DECODE_A, [site("far", B1, cached=1000), site("near", A1)], [],
                     PrefillChoice("far", 1.022, "remote", 3.0, "same_zone", 0.022), id="faster-beats-closer"),
        # Other zone, 2e7 bytes: 2.0 + 2.01 = 4.01 s > 3.0 s local.
        pytest.param(DECODE_A_BIG, [site("p", C2, kv=10_000)], [],
                     PrefillChoice(None, 3.0, "local_cheaper", 3.0), id="cross-zone-slow-link-local"),
        # Same zone, 2e7 bytes: 2.0 + 0.202 = 2.202 s < 3.0 s.
        pytest.param(DECODE_A_BIG, [site("p", B1, kv=10_000)], [],
                     PrefillChoice("p", 2.202, "remote", 3.0, "same_zone", 0.202), id="fast-link-remote"),
        # The cross-zone link measured at 1e9: 2.0 + 0.02 + 0.01 = 2.03 s, remote after all.
        pytest.param(DECODE_A_BIG, [site("p", C2, kv=10_000)], LEARNED_FAST_CROSS,
                     PrefillChoice("p", 2.03, "remote", 3.0, "cross_zone", 0.03), id="learned-fast-link-remote"),
        # The same-zone link measured at 1e7: 2.0 + 2.002 = 4.002 s, local after all.
        pytest.param(DECODE_A_BIG, [site("p", B1, kv=10_000)], LEARNED_SLOW_SAME_ZONE,
                     PrefillChoice(None, 3.0, "local_cheaper", 3.0), id="learned-slow-link-local"),
        # A learned link teaches nothing about another pair: c -> a is still the 1e7 default (as in the
        # cross-zone case above), b -> a learned fast would not change it.
        pytest.param(DECODE_A_BIG, [site("p", C2, kv=10_000)], [(B1, A1, 20_000_000, 0.022)],
                     PrefillChoice(None, 3.0, "local_cheaper", 3.0), id="unknown-pair-uses-defaults"),
        # Measured 4,000 tokens/s: 0.5 + 0.003 s.
        pytest.param(DECODE_A, [site("p", A1, load=WorkerLoad(num_waiting_tokens=0, prefill_tokens_per_s=4000.0))],
                     [], PrefillChoice("p", 0.503, "remote", 3.0, "same_node", 0.003), id="measured-rate"),
        # Decode worker: 1,000 tokens cached locally (local 1.5 s) and 1,000 KV bytes to pull (same zone 0.012 s).
        pytest.param(site("d", A1, cached=1000), [site("p", B1)], [],
                     PrefillChoice(None, 1.5, "local_cheaper", 1.5), id="decode-cache-local"),
        # The slow cross-zone case again, with 6 decode streams on the decode worker: local 2.0 * (1.5 + 0.6)
        # = 4.2 s, so the 4.01 s remote prefill wins now.
        pytest.param(site("d", A1, kv=10_000, load=WorkerLoad(num_running=6, num_waiting_tokens=0)),
                     [site("p", C2, kv=10_000)], [],
                     PrefillChoice("p", 4.01, "remote", 4.2, "cross_zone", 2.01), id="decode-streams-interfere"),
        # KV size unknown everywhere: the move costs its latency (cross zone 0.01 s).
        pytest.param(site("d", A1, kv=0), [site("p", C2, kv=0)], [],
                     PrefillChoice("p", 2.01, "remote", 3.0, "cross_zone", 0.01), id="unknown-kv-size"),
    ],
)
def test_choose_prefill(decode: Site, prefill: list[Site], samples: list, expected: PrefillChoice) -> None:
    topology = Topology(TOPOLOGY)
    for src, dst, num_bytes, seconds in samples:
        assert topology.record(src, dst, num_bytes, seconds).use == "learned"
    assert same(choose_prefill(PROMPT, decode, prefill, topology, CONFIG), expected)


# Local cheaper (1,000 cached on the decode worker: local 1.5 s against 1.0 + 0.012 s remote compute and move),
# stalling the decode worker's streams for its 1,000 uncached tokens at 1,000 tokens/s: 1.0 s.
STREAMING = WorkerLoad(num_running=1, num_waiting_tokens=0)


@pytest.mark.parametrize(
    ("load", "num_handoffs_due", "max_stall_s", "expected"),
    [
        pytest.param(IDLE, 0, 0.025, PrefillChoice(None, 1.5, "local_cheaper", 1.5), id="no-streams-no-stall"),
        pytest.param(STREAMING, 0, float("inf"), PrefillChoice(None, 1.6, "local_cheaper", 1.6), id="no-cap"),
        pytest.param(STREAMING, 0, 1.0, PrefillChoice(None, 1.6, "local_cheaper", 1.6), id="stall-at-cap"),
        pytest.param(STREAMING, 0, 0.025, PrefillChoice("p", 2.012, "remote", 1.6, "same_zone", 0.012),
                     id="stall-over-cap-remote"),
        # A hand-off on its way is a stream the local prefill would stall too.
        pytest.param(IDLE, 1, 0.025, PrefillChoice("p", 2.012, "remote", 1.5, "same_zone", 0.012),
                     id="handoff-due-remote"),
    ],
)
def test_local_cheaper_only_within_the_stall_cap(load: WorkerLoad, num_handoffs_due: int, max_stall_s: float,
                                                expected: PrefillChoice) -> None:
    decode = replace(site("d", A1, cached=1000, load=load), num_handoffs_due=num_handoffs_due)
    choice = choose_prefill(PROMPT, decode, [site("p", B1)], Topology(TOPOLOGY), CONFIG, max_stall_s)
    assert same(choice, expected)
    pair = choose_pair(PROMPT, [decode], [site("p", B1)], Topology(TOPOLOGY), CONFIG, max_stall_s)
    assert same(pair, PairChoice("d", expected))


# b -> a pulls of 2e7 bytes: 2.002 s is 1e7 bytes/s (slow: remote 4.002 s, local wins), 0.022 s 1e9 bytes/s.
SLOW_PULL, FAST_PULL, PAIR = 2.002, 0.022, ("p", "d")


@pytest.mark.parametrize(
    ("pulls", "expected"),
    [
        # Fewer than min_samples (3): the same-zone default (1e8) prices the link, remote 2.202 s.
        pytest.param([(SLOW_PULL, None)], PrefillChoice("p", 2.202, "remote", 3.0, "same_zone", 0.202),
                     id="one-slow-pull-not-learned"),
        pytest.param([(SLOW_PULL, None)] * 2, PrefillChoice("p", 2.202, "remote", 3.0, "same_zone", 0.202),
                     id="two-slow-pulls-not-learned"),
        pytest.param([(SLOW_PULL, None)] * 3, PrefillChoice(None, 3.0, "local_cheaper", 3.0),
                     id="three-slow-pulls-learned"),
        # The pair's wire-up pull is not learned from; the three after it are: 2.0 + 0.022 s.
        pytest.param([(SLOW_PULL, PAIR)] + [(FAST_PULL, PAIR)] * 3,
                     PrefillChoice("p", 2.022, "remote", 3.0, "same_zone", 0.022), id="wire-up-not-counted"),
        # A slow pull after the wire-up is outvoted by the median of three.
        pytest.param([(SLOW_PULL, PAIR), (SLOW_PULL, PAIR), (FAST_PULL, PAIR), (FAST_PULL, PAIR)],
                     PrefillChoice("p", 2.022, "remote", 3.0, "same_zone", 0.022), id="slow-pull-outvoted"),
    ],
)
def test_one_slow_pull_does_not_price_a_link(pulls: list, expected: PrefillChoice) -> None:
    topology = Topology(replace(TOPOLOGY, min_samples=3))
    for seconds, pair in pulls:
        topology.record(B1, A1, 20_000_000, seconds, pair=pair)
    assert same(choose_prefill(PROMPT, DECODE_A_BIG, [site("p", B1, kv=10_000)], topology, CONFIG), expected)


QUEUED_4000 = WorkerLoad(num_waiting=2, num_waiting_tokens=4000)
QUEUED_2_REQUESTS = WorkerLoad(num_waiting=2)  # an engine that counts no tokens (-1): 2 * 1,024 tokens


STREAMING_A = site("d", A1, load=WorkerLoad(num_running=1, num_waiting_tokens=0))  # local: 2.0 * (1.5 + 0.1) s


@pytest.mark.parametrize(
    ("load", "queue_aware", "idle_decode", "decode", "expected"),
    [
        # Remote 4.0 s queue + 2.003 s = 6.003 s. Without idle-decode prefills the prompt's own work decides
        # (2.003 < 3.0 s): remote, and the queue only ranks prefill workers.
        (QUEUED_4000, False, False, DECODE_A, PrefillChoice("p", 6.003, "remote", 3.0, "same_node", 0.003)),
        # Queue-aware: 6.003 s > 3.0 s local.
        (QUEUED_4000, True, False, DECODE_A, PrefillChoice(None, 3.0, "local_cheaper", 3.0)),
        (QUEUED_2_REQUESTS, False, False, DECODE_A, PrefillChoice("p", 4.051, "remote", 3.0, "same_node", 0.003)),
        (QUEUED_2_REQUESTS, True, False, DECODE_A, PrefillChoice(None, 3.0, "local_cheaper", 3.0)),
        # The decode worker has no streams: its 2.0 s of compute, nothing to stall, against 4.0 + 2.0 s there.
        (QUEUED_4000, False, True, DECODE_A, PrefillChoice(None, 2.0, "idle_decode", 2.0)),
        # ...but with a stream on it, a local prefill is priced as a stall again: remote.
        (QUEUED_4000, False, True, STREAMING_A, PrefillChoice("p", 6.003, "remote", 3.2, "same_node", 0.003)),
        # An idle pair prefills remotely: the move alone (0.003 s) does not send a prompt to the decode worker.
        (WorkerLoad(num_waiting_tokens=0), False, True, DECODE_A,
         PrefillChoice("p", 2.003, "remote", 3.0, "same_node", 0.003)),
        # 0.1 s of queue: 2.0 s is not sooner than 2.1 s by more than the 5% tolerance; 0.2 s of queue: it is.
        (WorkerLoad(num_waiting=1, num_waiting_tokens=100), False, True, DECODE_A,
         PrefillChoice("p", 2.103, "remote", 3.0, "same_node", 0.003)),
        (WorkerLoad(num_waiting=1, num_waiting_tokens=200), False, True, DECODE_A,
         PrefillChoice(None, 2.0, "idle_decode", 2.0)),
    ],
)
def test_prefill_queue(load: WorkerLoad, queue_aware: bool, idle_decode: bool, decode: Site,
                       expected: PrefillChoice) -> None:
    config = replace(CONFIG, queue_aware_local=queue_aware, idle_decode_prefills=idle_decode)
    choice = choose_prefill(PROMPT, decode, [site("p", A1, load=load)], Topology(TOPOLOGY), config)
    assert same(choice, expected)


def test_queue_ranks_prefill_workers() -> None:
    # p1 holds 1,000 tokens of the prompt (1.0 + 0.003 s) but has 2,000 queued (2.0 s); p2 is idle, 2.003 s.
    sites = [site("p1", A1, cached=1000, load=WorkerLoad(num_waiting_tokens=2000)), site("p2", A1)]
    choice = choose_prefill(PROMPT, DECODE_A, sites, Topology(TOPOLOGY), CONFIG)
    assert same(choice, PrefillChoice("p2", 2.003, "remote", 3.0, "same_node", 0.003))


def test_few_decode_streams_keep_the_slow_link_local() -> None:
    # Same case with 4 streams: local 2.0 * 1.9 = 3.8 s < 4.01 s remote.
    decode = site("d", A1, kv=10_000, load=WorkerLoad(num_running=4, num_waiting_tokens=0))
    choice = choose_prefill(PROMPT, decode, [site("p", C2, kv=10_000)], Topology(TOPOLOGY), CONFIG)
    assert same(choice, PrefillChoice(None, 3.8, "local_cheaper", 3.8))


MEASURED_500 = WorkerLoad(num_waiting_tokens=0, prefill_tokens_per_s=500.0)


@pytest.mark.parametrize(
    ("peer_rate", "expected"),
    [
        # A decode worker that measured no rate, at the default 1,000 tokens/s: local 2.0 * 1.5 = 3.0 s beats the
        # prefill worker's measured 500 tokens/s (4.0 + 0.003 s), though the decode worker runs the same engine.
        (0.0, PrefillChoice(None, 3.0, "local_cheaper", 3.0)),
        # At its peers' 500 tokens/s: local 4.0 * 1.5 = 6.0 s; remote 4.003 s.
        (500.0, PrefillChoice("p", 4.003, "remote", 6.0, "same_node", 0.003)),
    ],
)
def test_an_unmeasured_decode_worker_is_priced_at_its_peers_rate(peer_rate: float, expected: PrefillChoice) -> None:
    decode = replace(DECODE_A, peer_tokens_per_s=peer_rate)
    prefill = site("p", A1, load=MEASURED_500)
    assert same(choose_prefill(PROMPT, decode, [prefill], Topology(TOPOLOGY), CONFIG), expected)


def test_a_measured_rate_outranks_the_peers() -> None:
    decode = site("d", A1, load=WorkerLoad(num_waiting_tokens=0, prefill_tokens_per_s=2000.0))
    decode = replace(decode, peer_tokens_per_s=500.0)
    # Local at its own 2,000 tokens/s: 1.0 * 1.5 = 1.5 s < remote 4.003 s.
    choice = choose_prefill(PROMPT, decode, [site("p", A1, load=MEASURED_500)], Topology(TOPOLOGY), CONFIG)
    assert same(choice, PrefillChoice(None, 1.5, "local_cheaper", 1.5))


@pytest.mark.parametrize(
    ("rates", "expected"),
    [([], 0.0), ([0.0, 0.0], 0.0), ([0.0, 800.0], 800.0), ([900.0, 0.0, 700.0], 800.0),
     ([1000.0, 500.0, 600.0, float("inf")], 600.0)],
)
def test_typical_rate(rates: list[float], expected: float) -> None:
    assert typical_rate([WorkerLoad(prefill_tokens_per_s=r) for r in rates]) == expected


@pytest.mark.parametrize(
    ("decode", "prefill", "expected"),
    [
        # Two idle decode workers, the prefill worker on b: the one beside it (same node) wins.
        pytest.param([site("da", A1), site("db", B1)], [site("p", B1)],
                     PairChoice("db", PrefillChoice("p", 2.003, "remote", 3.0, "same_node", 0.003)),
                     id="pair-on-one-node"),
        # Prefill workers on b and c, decode on a and c: (p-c, d-c) same node beats (p-b, d-a) same zone.
        pytest.param([site("da", A1), site("dc", C2)], [site("pb", B1), site("pc", C2)],
                     PairChoice("dc", PrefillChoice("pc", 2.003, "remote", 3.0, "same_node", 0.003)),
                     id="pair-same-node-among-several"),
        # The same-node pair's prefill worker is busy (2,000 queued, 4.003 s): the same-zone pair, 2.022 s.
        pytest.param([site("da", A1), site("dc", C2)],
                     [site("pb", B1), site("pc", C2, load=WorkerLoad(num_waiting_tokens=2000))],
                     PairChoice("da", PrefillChoice("pb", 2.022, "remote", 3.0, "same_zone", 0.022)),
                     id="pair-busy-same-node-loses"),
        # Two prefill workers on c, one busy; two decode workers on c, one with a stream: the idle ones pair.
        pytest.param([site("da", A1), site("dc1", C2, load=WorkerLoad(num_running=1, num_waiting_tokens=0)),
                      site("dc2", C2)],
                     [site("pc1", C2, load=WorkerLoad(num_waiting_tokens=2000)), site("pc2", C2)],
                     PairChoice("dc2", PrefillChoice("pc2", 2.003, "remote", 3.0, "same_node", 0.003)),
                     id="pair-within-a-place"),
    ],
)
def test_choose_pair(decode: list[Site], prefill: list[Site], expected: PairChoice) -> None:
    assert same(choose_pair(PROMPT, decode, prefill, Topology(TOPOLOGY), CONFIG), expected)


def test_choose_pair_never_pairs_a_worker_with_itself() -> None:
    both = site("b", A1)
    choice = choose_pair(PROMPT, [both], [both], Topology(TOPOLOGY), CONFIG)
    assert same(choice, PairChoice("b", PrefillChoice(None, 3.0, "no_remote", 3.0)))


@pytest.mark.parametrize(
    ("load", "expected"),
    [(WorkerLoad(num_waiting=3, num_waiting_tokens=100), 100), (WorkerLoad(num_waiting=3), 3 * 1024),
     (WorkerLoad(), 0)],
)
def test_queued_tokens(load: WorkerLoad, expected: int) -> None:
    assert queued_tokens(load, CONFIG) == expected


def test_config_from_a_profile() -> None:
    timing = TimingModel(prefill_coeffs_s=(0.024, 0.001, 0.0), transfer_bandwidth_bytes_per_s=5e9,
                         transfer_latency_s=0.002)
    config = CostConfig.from_timing(timing, local_prefill_factor=2.0)
    # 1,024 tokens in 0.024 + 1.024 s.
    assert config.prefill_tokens_per_s == pytest.approx(1024 / 1.048)
    assert (config.topology.same_node_bytes_per_s, config.topology.same_node_latency_s) == (5e9, 0.002)
    assert config.topology.same_zone_bytes_per_s == TopologyConfig().same_zone_bytes_per_s
    assert config.local_prefill_factor == 2.0


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        CostConfig(prefill_tokens_per_s=0)
    with pytest.raises(ValueError):
        CostConfig(local_prefill_factor=0)
