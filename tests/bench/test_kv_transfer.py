"""bench/kv_transfer.py: a phase's pulls from WorkerStats, per-pull figures, the like-for-like raw READ."""

from __future__ import annotations

import pytest

from bench.kv_transfer import compare_to_raw, like_variant, pull_summary, pulls_between

MB25 = 25_000_000
RAW = {"scattered": {"num_descriptors": 756, "gbps_median": 4.0},
       "coalesced": {"num_descriptors": 12, "gbps_median": 5.0}}


def _pull(seq: int, ms: float, descs: int = 12) -> dict:
    return {"seq": seq, "seconds": ms / 1e3, "num_bytes": MB25, "num_descriptors": descs, "post_seconds": ms / 1e3}


def test_a_phase_is_the_pulls_numbered_after_its_start() -> None:
    before = {"num_transfers": 2}
    after = {"num_transfers": 4, "recent_transfers": [_pull(1, 5), _pull(2, 5), _pull(3, 6), _pull(4, 7)]}
    assert [p["seq"] for p in pulls_between(before, after)] == [3, 4]
    assert pulls_between({}, {"num_transfers": 0}) == []


def test_median_pull_not_the_sum_compares_with_the_raw_median() -> None:
    # Four 5 ms pulls and one 50 ms outlier: the median pull runs at 5 GB/s, the phase's aggregate far lower.
    s = pull_summary([_pull(i, ms) for i, ms in enumerate([5, 5, 50, 5, 5], 1)])
    assert (s["n"], s["ms_median"], s["ms_max"], s["gbps_median"]) == (5, 5.0, 50.0, 5.0)
    assert s["gbps_aggregate"] == pytest.approx(125e6 / 0.070 / 1e9, abs=1e-3)
    assert compare_to_raw(s["gbps_median"], s["descriptors_median"], RAW)["fraction_of_raw_nixl_read"] == 1.0
    assert pull_summary([]) == {"n": 0}


@pytest.mark.parametrize(("descriptors", "variant"), [(12, "coalesced"), (24, "coalesced"), (500, "scattered"),
                                                      (0, "coalesced")])
def test_like_variant_is_nearest_in_descriptors(descriptors: float, variant: str) -> None:
    assert like_variant(descriptors, RAW) == variant
