from __future__ import annotations

from services.router.event_watch import EventWatch


def test_silent_worker_is_reported_once_until_events_resume() -> None:
    watch = EventWatch(stale_s=30.0, min_requests=3)
    watch.registered("w0", now_s=0.0)
    watch.registered("w1", now_s=0.0)
    for _ in range(3):
        watch.routed("w0")
    watch.routed("w1")  # too few requests to expect events
    assert watch.newly_stale(now_s=29.0) == []
    assert watch.newly_stale(now_s=31.0) == ["w0"]
    assert watch.newly_stale(now_s=60.0) == []  # once per silence
    watch.event("w0", now_s=61.0)
    for _ in range(3):
        watch.routed("w0")
    assert watch.newly_stale(now_s=90.0) == []
    assert watch.newly_stale(now_s=92.0) == ["w0"]
    watch.forget("w0")
    watch.routed("unknown")
    assert watch.newly_stale(now_s=200.0) == []
