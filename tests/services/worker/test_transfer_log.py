"""TransferLog: cumulative counts, a bounded window of recent pulls, each pull's seconds drained once."""

from __future__ import annotations

import pytest

from common.protocol import TransferSample, WorkerLoad, WorkerStats, decode, encode
from services.worker.transfer_log import TransferLog


def test_recent_pulls_are_a_bounded_window_numbered_from_the_start() -> None:
    log = TransferLog(max_recent=2)
    log.record(0.010, 100, num_descriptors=12, post_seconds=0.009)
    log.record(0.020, 200)
    log.record(0.030, 300, num_descriptors=24)
    assert (log.num_transfers, log.num_bytes, log.num_descriptors) == (3, 600, 36)
    assert log.seconds_total == pytest.approx(0.060)
    # The oldest fell out; seq still says which pull each one was.
    assert log.recent() == (TransferSample(seq=2, seconds=0.020, num_bytes=200),
                            TransferSample(seq=3, seconds=0.030, num_bytes=300, num_descriptors=24))
    assert log.drain_seconds() == (0.010, 0.020, 0.030)  # every pull once, the evicted one too
    assert log.drain_seconds() == ()


def test_worker_stats_carry_recent_pulls_over_the_wire() -> None:
    samples = (TransferSample(seq=7, seconds=0.004, num_bytes=24_772_608, num_descriptors=12, post_seconds=0.004),)
    stats = WorkerStats(request_id="r", worker_id="w", load=WorkerLoad(), num_transfers=7,
                        recent_transfers=samples)
    assert decode(encode(stats)) == stats


def test_a_simulated_log_marks_every_sample() -> None:
    real, fake = TransferLog(), TransferLog(simulated=True)
    for log in (real, fake):
        log.record(0.010, 100, src_worker_id="p")
        log.record(0.020, 200, dst_worker_id="d")
    assert [s.simulated for s in real.recent()] == [False, False]
    assert [s.simulated for s in fake.recent()] == [True, True]
