"""Links between nodes: relation defaults until measured, then the median of recent pulls."""

from __future__ import annotations

import pytest

from services.router.topology import Link, Place, Topology, TopologyConfig, relation

CONFIG = TopologyConfig(same_node_bytes_per_s=1e9, same_zone_bytes_per_s=1e8, cross_zone_bytes_per_s=1e7,
                        same_node_latency_s=0.001, same_zone_latency_s=0.002, cross_zone_latency_s=0.01,
                        window=3, min_sample_bytes=1000)
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
    topology = Topology(CONFIG)
    # 1e6 bytes in 0.012 s, less the same-zone latency 0.002 s: 1e8 bytes/s; then 5e7; then 2e8.
    assert topology.record(A1, B1, 1_000_000, 0.012) == pytest.approx(1e8)
    assert topology.record(A1, B1, 1_000_000, 0.022) == pytest.approx(0.75e8)  # median of two: their mean
    assert topology.record(A1, B1, 1_000_000, 0.007) == pytest.approx(1e8)
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
    topology = Topology(CONFIG)
    assert topology.record(A1, B1, num_bytes, seconds) is None
    assert topology.link(A1, B1).learned is False


def test_latency_larger_than_the_sample_halves_it_at_most() -> None:
    # A pull faster than the configured cross-zone latency (1e6 bytes in 0.004 s, latency 0.01 s): the fixed
    # part is capped at half the sample, so 1e6 / 0.002 = 5e8 bytes/s, not a negative or infinite figure.
    topology = Topology(CONFIG)
    assert topology.record(A1, C2, 1_000_000, 0.004) == pytest.approx(5e8)


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        TopologyConfig(same_zone_bytes_per_s=0)
    with pytest.raises(ValueError):
        TopologyConfig(cross_zone_latency_s=-1)


def test_a_link_without_recent_samples_goes_back_to_its_default() -> None:
    topology = Topology(TopologyConfig(same_zone_bytes_per_s=1e8, same_zone_latency_s=0.0, sample_ttl_s=60.0,
                                       min_sample_bytes=1000))
    topology.record(A1, B1, 1_000_000, 1.0, now_s=100.0)  # learned slow: 1e6 bytes/s
    topology.record(B1, A1, 1_000_000, 1.0, now_s=150.0)
    assert topology.expire(now_s=160.0) == []  # 60 s after the last sample: still kept
    assert topology.link(A1, B1).bytes_per_s == pytest.approx(1e6)
    assert topology.expire(now_s=160.5) == [("a", "b")]
    assert topology.link(A1, B1) == Link("same_zone", 1e8, 0.0)  # the default again: it will be tried
    assert topology.learned_links() == {("b", "a"): pytest.approx(1e6)}
    # A new sample starts a fresh window (the old ones are gone).
    assert topology.record(A1, B1, 1_000_000, 0.1, now_s=200.0) == pytest.approx(1e7)
