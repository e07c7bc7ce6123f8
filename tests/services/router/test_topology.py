"""Links between nodes: relation defaults until measured (min_samples pulls, a pair's wire-up pull not
counted), then the median of recent pulls."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.router.topology import Link, Place, Recorded, Topology, TopologyConfig, relation

CONFIG = TopologyConfig(same_node_bytes_per_s=1e9, same_zone_bytes_per_s=1e8, cross_zone_bytes_per_s=1e7,
                        same_node_latency_s=0.001, same_zone_latency_s=0.002, cross_zone_latency_s=0.01,
                        window=3, min_sample_bytes=1000)  # min_samples 3, num_warmup_pulls 1: the defaults
ONE = replace(CONFIG, min_samples=1)  # every sample counts at once: the median's own arithmetic
A1, B1, C2 = Place("a", "z1"), Place("b", "z1"), Place("c", "z2")


@pytest.mark.parametrize(
    ("src", "dst", "expected"),
    [
        (A1, A1, "same_node"),
        (A1, Place("a", "z2"), "same_node"),  # the node decides first
        (A1, B1, "same_zone"),
        (A1, C2, "cross_zone"),
        (Place(""), Place(""), "same_node"),  # nothing labelled: one host
        (Place("a"), Place("b"), "same_zone"),  # nodes without zones: one zone
    ],
)
def test_relation(src: Place, dst: Place, expected: str) -> None:
    assert relation(src, dst) == expected


def test_defaults_per_relation() -> None:
    topology = Topology(CONFIG)
    assert topology.link(A1, A1) == Link("same_node", 1e9, 0.001)
    assert topology.link(A1, B1) == Link("same_zone", 1e8, 0.002)
    assert topology.link(A1, C2) == Link("cross_zone", 1e7, 0.01)


def test_transfer_seconds() -> None:
    link = Link("same_zone", 1e8, 0.002)
    assert link.transfer_s(2_000_000) == pytest.approx(0.022)
    assert link.transfer_s(0) == 0.0


def test_learned_median_replaces_the_default_for_that_direction_only() -> None:
    topology = Topology(ONE)
    # 1e6 bytes in 0.012 s, less the same-zone latency 0.002 s: 1e8 bytes/s; then 5e7; then 2e8.
    assert topology.record(A1, B1, 1_000_000, 0.012) == Recorded("learned", pytest.approx(1e8))
    assert topology.record(A1, B1, 1_000_000, 0.022).bytes_per_s == pytest.approx(0.75e8)  # median of two
    assert topology.record(A1, B1, 1_000_000, 0.007).bytes_per_s == pytest.approx(1e8)
    assert topology.link(A1, B1) == Link("same_zone", pytest.approx(1e8), 0.002, learned=True)
    assert topology.link(B1, A1) == Link("same_zone", 1e8, 0.002)  # the other direction: still the default
    assert topology.link(Place("d", "z1"), B1).learned is False  # an unknown pair: the default
    assert topology.learned_links() == {("a", "b"): pytest.approx(1e8)}


def test_window_forgets_old_samples() -> None:
    topology = Topology(CONFIG)
    for _ in range(3):
        topology.record(A1, C2, 1_000_000, 0.11)  # 1e7 bytes/s after the 0.01 s latency
    for _ in range(2):
        topology.record(A1, C2, 1_000_000, 0.02)  # the link got faster: 1e8
    assert topology.link(A1, C2).bytes_per_s == pytest.approx(1e8)  # 2 of the last 3


@pytest.mark.parametrize(
    ("num_bytes", "seconds"),
    [(999, 0.5), (1_000_000, 0.0)],  # too small to time bandwidth; an instant (mock at infinite speed)
)
def test_samples_that_say_nothing_are_ignored(num_bytes: int, seconds: float) -> None:
    topology = Topology(ONE)
    assert topology.record(A1, B1, num_bytes, seconds) == Recorded("ignored", None)
    assert topology.link(A1, B1).learned is False


def test_latency_larger_than_the_sample_halves_it_at_most() -> None:
    # A pull faster than the configured cross-zone latency (1e6 bytes in 0.004 s, latency 0.01 s): the fixed
    # part is capped at half the sample, so 1e6 / 0.002 = 5e8 bytes/s, not a negative or infinite figure.
    topology = Topology(ONE)
    assert topology.record(A1, C2, 1_000_000, 0.004).bytes_per_s == pytest.approx(5e8)


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        TopologyConfig(same_zone_bytes_per_s=0)
    with pytest.raises(ValueError):
        TopologyConfig(cross_zone_latency_s=-1)
    for bad in ({"min_samples": 0}, {"min_samples": 4, "window": 3}, {"num_warmup_pulls": -1}):
        with pytest.raises(ValueError, match="min_samples"):
            TopologyConfig(**bad)


def test_a_link_without_recent_samples_goes_back_to_its_default() -> None:
    topology = Topology(TopologyConfig(same_zone_bytes_per_s=1e8, same_zone_latency_s=0.0, sample_ttl_s=60.0,
                                       min_sample_bytes=1000, min_samples=1))
    topology.record(A1, B1, 1_000_000, 1.0, now_s=100.0)  # learned slow: 1e6 bytes/s
    topology.record(B1, A1, 1_000_000, 1.0, now_s=150.0)
    assert topology.expire(now_s=160.0) == []  # 60 s after the last sample: still kept
    assert topology.link(A1, B1).bytes_per_s == pytest.approx(1e6)
    assert topology.expire(now_s=160.5) == [("a", "b")]
    assert topology.link(A1, B1) == Link("same_zone", 1e8, 0.0)  # the default again: it will be tried
    assert topology.learned_links() == {("b", "a"): pytest.approx(1e6)}
    # A new sample starts a fresh window (the old ones are gone).
    assert topology.record(A1, B1, 1_000_000, 0.1, now_s=200.0).bytes_per_s == pytest.approx(1e7)


# 1e6 bytes over a same-zone link (0.002 s latency): 0.012 s is 1e8 bytes/s, 1.002 s (a slow pull) 1e6.
FAST, SLOW = 0.012, 1.002


@pytest.mark.parametrize(
    ("pulls", "expected"),
    [
        pytest.param([FAST], Recorded("pending", None), id="one-of-three-not-learned"),
        pytest.param([FAST, FAST], Recorded("pending", None), id="two-of-three-not-learned"),
        pytest.param([FAST, FAST, FAST], Recorded("learned", 1e8), id="three-learned"),
        # The median of three rides out one slow pull, wherever it falls.
        pytest.param([SLOW, FAST, FAST], Recorded("learned", 1e8), id="slow-first-outvoted"),
        pytest.param([FAST, SLOW, FAST], Recorded("learned", 1e8), id="slow-middle-outvoted"),
        # Two slow of three: the link is slow (that is what it measured).
        pytest.param([SLOW, SLOW, FAST], Recorded("learned", 1e6), id="mostly-slow-learned-slow"),
    ],
)
def test_a_link_needs_min_samples(pulls: list[float], expected: Recorded) -> None:
    topology = Topology(CONFIG)
    results = [topology.record(A1, B1, 1_000_000, seconds) for seconds in pulls]
    assert results[-1] == Recorded(expected.use, pytest.approx(expected.bytes_per_s))
    learned = expected.use == "learned"
    assert topology.link(A1, B1) == Link("same_zone", pytest.approx(expected.bytes_per_s if learned else 1e8), 0.002,
                                         learned=learned)
    assert all(r.use == "pending" for r in results[:-1])


def test_each_pairs_first_pull_is_wire_up_not_learned() -> None:
    topology = Topology(CONFIG)
    # At start, three prefill workers on a each make their first pull to d on b, each slow (NIXL's wire-up):
    # none is learned from, so three of them cannot make a median that prices the link slow.
    for src_worker in ("p1", "p2", "p3"):
        assert topology.record(A1, B1, 1_000_000, SLOW, pair=(src_worker, "d")) == Recorded("warmup", None)
    assert topology.link(A1, B1).learned is False
    # Their next pulls are the link's steady state: learned at the third.
    uses = [topology.record(A1, B1, 1_000_000, FAST, pair=(w, "d")).use for w in ("p1", "p2", "p3")]
    assert uses == ["pending", "pending", "learned"]
    assert topology.link(A1, B1).bytes_per_s == pytest.approx(1e8)
    # A fourth worker joins: its wire-up pull leaves the learned link as it was.
    assert topology.record(A1, B1, 1_000_000, SLOW, pair=("p4", "d")) == Recorded("warmup", pytest.approx(1e8))
    assert topology.link(A1, B1).bytes_per_s == pytest.approx(1e8)


def test_a_small_first_pull_is_the_wire_up_too() -> None:
    topology = Topology(ONE)
    assert topology.record(A1, B1, 10, 0.5, pair=("p", "d")).use == "warmup"  # it paid the wire-up
    assert topology.record(A1, B1, 1_000_000, FAST, pair=("p", "d")) == Recorded("learned", pytest.approx(1e8))


def test_a_worker_that_registers_again_wires_up_again() -> None:
    topology = Topology(ONE)
    topology.record(A1, B1, 1_000_000, SLOW, pair=("p", "d"))
    assert topology.record(A1, B1, 1_000_000, FAST, pair=("p", "d")).use == "learned"
    topology.forget_worker("d")  # a new engine behind the same id
    assert topology.record(A1, B1, 1_000_000, SLOW, pair=("p", "d")).use == "warmup"
    assert topology.link(A1, B1).bytes_per_s == pytest.approx(1e8)


def test_no_warmup_when_configured_off() -> None:
    topology = Topology(replace(ONE, num_warmup_pulls=0))
    assert topology.record(A1, B1, 1_000_000, SLOW, pair=("p", "d")) == Recorded("learned", pytest.approx(1e6))


def test_a_link_expires_before_it_was_learned() -> None:
    topology = Topology(replace(CONFIG, sample_ttl_s=60.0))
    topology.record(A1, B1, 1_000_000, FAST, now_s=0.0)  # pending: 1 of 3
    assert topology.expire(now_s=61.0) == [("a", "b")]
    assert topology.learned_links() == {}
    # Its window started over: two more samples are still short of three.
    for _ in range(2):
        assert topology.record(A1, B1, 1_000_000, FAST, now_s=70.0).use == "pending"
