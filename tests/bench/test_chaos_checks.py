"""bench/chaos_checks.py: the seeded fault schedule and the invariants of the chaos run, on plain data."""

from __future__ import annotations

import pytest

from bench.chaos_checks import (KINDS, Fault, Outcome, blocks_leaked, replicas_agree, rss_drift, schedule,
                                verdict)

TARGETS = ["frontend-0", "router-0", "decode-c"]


def test_schedule_is_a_function_of_the_seed() -> None:
    assert schedule(7, 600, TARGETS) == schedule(7, 600, TARGETS)
    assert schedule(7, 600, TARGETS) != schedule(8, 600, TARGETS)


@pytest.mark.parametrize("duration_s", [5.0, 60.0, 1200.0])
def test_schedule_gaps_kinds_and_targets(duration_s: float) -> None:
    plan = schedule(3, duration_s, TARGETS)
    times = [0.0] + [f.at_s for f in plan]
    assert all(10.0 - 1e-3 <= b - a <= 30.0 + 1e-3 for a, b in zip(times, times[1:]))
    assert all(f.at_s < duration_s and f.kind in KINDS and f.target in TARGETS for f in plan)
    assert len(plan) >= int(duration_s // 30) - 1


def test_a_long_schedule_has_every_kind_and_target() -> None:
    plan = schedule(1, 1200, TARGETS)
    assert {f.kind for f in plan} == set(KINDS)
    assert {f.target for f in plan} == set(TARGETS)
    assert isinstance(plan[0], Fault)


DOWN = [(100.0, 103.0)]  # frontend killed at 100 s, answering again at 103 s


@pytest.mark.parametrize(("outcome", "expected"), [
    (Outcome(0, "frontend-0", 10, 12, "abc"), "ok"),
    (Outcome(0, "frontend-0", 10, 12, "abd"), "mismatch"),
    (Outcome(0, "frontend-0", 10, 130, None, "timeout after 120s", True), "timeout"),
    (Outcome(0, "frontend-0", 99, 100.2, None, "connection lost"), "clean_error"),  # in flight at the kill
    (Outcome(0, "frontend-0", 102, 102.1, None, "connect failed"), "clean_error"),  # sent while it was down
    (Outcome(0, "frontend-0", 103.5, 103.6, None, "connect failed"), "clean_error"),  # within the 1 s slack
    (Outcome(0, "frontend-0", 50, 51, None, "HTTP 503"), "error_without_frontend_kill"),
    (Outcome(0, "frontend-0", 110, 111, None, "in-band error"), "error_without_frontend_kill"),
])
def test_verdict(outcome: Outcome, expected: str) -> None:
    assert verdict(outcome, "abc", DOWN) == expected


def test_blocks_leaked_names_only_workers_holding_blocks() -> None:
    assert blocks_leaked({"p": 1024, "d": 1020}, 1024) == {"d": 4}
    assert blocks_leaked({"p": 1024}, 1024) == {}


def test_rss_drift_over_processes_at_both_ends() -> None:
    assert rss_drift({"a": 100.0, "b": 50.0, "gone": 10.0}, {"a": 108.0, "b": 45.0}) == {"a": 0.08, "b": -0.1}


@pytest.mark.parametrize(("views", "agree"), [
    ({"r0": {"w1", "w2"}, "r1": {"w2", "w1"}}, True),
    ({"r0": {"w1", "w2"}, "r1": {"w1"}}, False),
    ({}, False),
])
def test_replicas_agree(views: dict, agree: bool) -> None:
    assert replicas_agree(views) is agree
