"""An engine's tier loads: numbered, the recent ones kept, each handed to a heartbeat once."""

from __future__ import annotations

from services.worker.tier_load_log import NewTierLoads, TierLoadLog, slowest_tier


def test_log_and_new_loads() -> None:
    log, new = TierLoadLog(max_recent=2), NewTierLoads()
    assert new.take(log.recent()) == ()
    log.record("host", 100, 0.5)
    log.record("disk", 200, 1.0)
    assert [(s.seq, s.tier) for s in new.take(log.recent())] == [(1, "host"), (2, "disk")]
    assert new.take(log.recent()) == ()  # reported once
    log.record("host", 300, 0.1)
    log.record("host", 400, 0.1)
    log.record("host", 500, 0.1)  # more than max_recent since the last beat: the oldest are gone
    assert [s.seq for s in new.take(log.recent())] == [4, 5]


def test_slowest_tier() -> None:
    assert slowest_tier(["host", "host"]) == "host"
    assert slowest_tier(["host", "disk"]) == "disk"
    assert slowest_tier([]) == "host"


def test_a_simulated_log_marks_every_load() -> None:
    real, fake = TierLoadLog(), TierLoadLog(simulated=True)
    for log in (real, fake):
        log.record("host", 100, 0.5)
        log.record("disk", 200, 1.0)
    assert [s.simulated for s in real.recent()] == [False, False]
    assert [s.simulated for s in fake.recent()] == [True, True]
