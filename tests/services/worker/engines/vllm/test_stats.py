"""EngineStatsSink on the stats vLLM itself produces: its own NixlKVConnectorStats (and MultiConnector's) recording
READ telemetry, passed as vLLM's scheduler passes them (``SchedulerStats.kv_connector_stats``, the ``to_dict()``
payload). If vLLM changes what it records, these fail; the real pulls are checked in tests/e2e/test_vllm_disagg.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiKVConnectorStats,  # noqa: E402
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats  # noqa: E402
from vllm.v1.metrics.stats import SchedulerStats  # noqa: E402

from common.protocol import TransferSample  # noqa: E402
from services.worker.engines.vllm.stats import EngineStatsSink  # noqa: E402


def _telemetry(xfer_us: float, post_us: float, num_bytes: int, num_descriptors: int) -> SimpleNamespace:
    # The fields of nixl's nixlXferTelemetry that vLLM reads (durations in microseconds).
    return SimpleNamespace(xferDuration=xfer_us, postDuration=post_us, totalBytes=num_bytes, descCount=num_descriptors,
                           startTime=0)


def _scheduler_stats(connector_stats) -> SchedulerStats:
    return SchedulerStats(kv_connector_stats=connector_stats.to_dict())


def test_reads_recorded_by_vllm_are_summed_and_kept_one_by_one() -> None:
    nixl = NixlKVConnectorStats()
    nixl.record_transfer(_telemetry(2000, 1500, 24_772_608, 12))
    nixl.record_transfer(_telemetry(3000, 2500, 24_772_608, 24))
    failed = NixlKVConnectorStats()
    failed.record_failed_transfer()
    sink = EngineStatsSink()
    sink.record_scheduler(_scheduler_stats(nixl))
    sink.record_scheduler(_scheduler_stats(failed))
    log = sink.transfers
    assert (log.num_transfers, log.num_bytes, log.num_descriptors) == (2, 49_545_216, 36)
    assert log.seconds_total == pytest.approx(0.005)
    assert sink.num_transfer_failures == 1
    assert log.recent() == (
        TransferSample(seq=1, seconds=0.002, num_bytes=24_772_608, num_descriptors=12, post_seconds=0.0015),
        TransferSample(seq=2, seconds=0.003, num_bytes=24_772_608, num_descriptors=24, post_seconds=0.0025),
    )
    assert log.drain_seconds() == pytest.approx((0.002, 0.003))
    assert log.drain_seconds() == ()  # handed out once; the total and the recent pulls stay
    assert len(log.recent()) == 2


def test_multiconnector_children_count_once() -> None:
    # P/D with kvtier: vLLM's MultiConnector reports each child's stats under its own name.
    nixl = NixlKVConnectorStats()
    nixl.record_transfer(_telemetry(4000, 4000, 1000, 12))
    multi = MultiKVConnectorStats(data={"NixlConnector": nixl})
    sink = EngineStatsSink()
    sink.record_scheduler(_scheduler_stats(multi))
    log = sink.transfers
    assert (log.num_transfers, log.num_bytes, log.num_descriptors) == (1, 1000, 12)


def test_kvtier_loads_reach_the_sink_alone_and_beside_nixl() -> None:
    """The kvtier connector's loads ride vLLM's connector stats: aggregated across workers, taken once, and
    read by the sink from its own dict or nested under MultiConnector (beside NIXL's READs)."""
    import pickle

    from services.worker.engines.vllm.tier.stats import TierLoadStats

    worker0, worker1 = TierLoadStats(), TierLoadStats()
    worker0.record("host", 1 << 20, 0.002)
    worker1.record("disk", 2 << 20, 0.004)
    taken = worker0.take()
    assert taken is not None and worker0.take() is None  # each load sent once
    merged = pickle.loads(pickle.dumps(taken)).aggregate(worker1)  # the engine core pickles worker outputs
    assert merged.reduce() == {"num_loads": 2, "num_bytes": 3 << 20, "bytes_per_s": (3 << 20) / 0.006}
    sink = EngineStatsSink()
    sink.record_scheduler(_scheduler_stats(merged))
    nixl = NixlKVConnectorStats()
    nixl.record_transfer(_telemetry(4000, 4000, 1000, 12))
    again = TierLoadStats()
    again.record("host", 4 << 20, 0.001)
    sink.record_scheduler(_scheduler_stats(MultiKVConnectorStats(data={"NixlConnector": nixl,
                                                                       "SplitserveTierConnector": again})))
    assert [(s.seq, s.tier, s.num_bytes, s.seconds) for s in sink.tier_loads.recent()] == [
        (1, "host", 1 << 20, 0.002), (2, "disk", 2 << 20, 0.004), (3, "host", 4 << 20, 0.001)]
    assert sink.transfers.num_transfers == 1  # the kvtier loads are not NIXL pulls


@pytest.mark.parametrize(
    ("old", "computed", "prefill_s", "expected"),
    [
        (0.0, 1000, 2.0, 500.0),  # the first measurement is the rate
        (500.0, 1000, 1.0, 600.0),  # then a moving average: 0.8 * 500 + 0.2 * 1000
        (500.0, 31, 0.001, 500.0),  # too few computed tokens (a pulled prompt's last token): per-step overhead
        (500.0, 1000, 0.0, 500.0),  # no prefill time recorded
    ],
)
def test_prefill_rate(old: float, computed: int, prefill_s: float, expected: float) -> None:
    from services.worker.engines.vllm.stats import prefill_rate

    assert prefill_rate(old, computed, prefill_s) == pytest.approx(expected)


def test_prefill_rate_comes_from_vllms_finished_request_stats() -> None:
    # vLLM's own IterationStats, filled as its output processor fills them: a local prefill of 800 tokens with 224
    # cached counts 576 computed over its prefill time; a pulled prompt (all but its last token external) does not.
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.stats import IterationStats, RequestStateStats

    stats = IterationStats()
    local = RequestStateStats(arrival_time=0.0)
    local.scheduled_ts, local.first_token_ts = 10.0, 11.2
    pulled = RequestStateStats(arrival_time=0.0)
    pulled.scheduled_ts, pulled.first_token_ts = 10.0, 10.5
    stats.update_from_finished_request(FinishReason.LENGTH, "a", 800, 16, local, num_cached_tokens=224)
    stats.update_from_finished_request(FinishReason.LENGTH, "b", 2000, 16, pulled, num_cached_tokens=1999)
    sink = EngineStatsSink()
    sink.record_iteration(stats)
    assert sink.prefill_tokens_per_s == pytest.approx(576 / 1.2)


@pytest.mark.parametrize(
    ("vllm_running", "in_flight", "expected"),
    [
        (0, 0, (0, 0)),  # idle
        (0, 1, (0, 1)),  # added since vLLM's last step, or in its first: waiting, not forgotten
        (2, 3, (2, 1)),
        (3, 3, (3, 0)),
        (2, 1, (1, 0)),  # vLLM's count still holds a request that has finished here
        (1, 0, (0, 0)),
    ],
)
def test_in_engine_counts_are_the_requests_in_flight(vllm_running: int, in_flight: int,
                                                     expected: tuple[int, int]) -> None:
    from services.worker.engines.vllm.stats import in_engine_counts

    assert in_engine_counts(vllm_running, in_flight) == expected
