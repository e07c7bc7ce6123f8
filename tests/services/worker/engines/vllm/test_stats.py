"""EngineStatsSink: vLLM's NIXL connector stats summed into the figures a worker reports (exact, no engine)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from common.protocol import TransferSample  # noqa: E402
from services.worker.engines.vllm.stats import EngineStatsSink  # noqa: E402


def _nixl(durations_s: list[float], nbytes: list[int], descs: list[int], failed: int = 0) -> dict:
    # NixlKVConnectorStats.data: one entry per finished READ, one per failure event.
    return {"transfer_duration": durations_s, "post_duration": durations_s, "bytes_transferred": nbytes,
            "num_descriptors": descs, "num_failed_transfers": [1] * failed, "num_failed_handshakes": []}


def test_nixl_reads_are_summed_and_kept_one_by_one() -> None:
    sink = EngineStatsSink()
    sink._record_connector(_nixl([0.002, 0.003], [24_772_608, 24_772_608], [12, 24]))
    sink._record_connector(_nixl([], [], [], failed=1))
    log = sink.transfers
    assert (log.num_transfers, log.num_bytes, log.num_descriptors) == (2, 49_545_216, 36)
    assert log.seconds_total == pytest.approx(0.005)
    assert sink.num_transfer_failures == 1
    assert log.recent() == (
        TransferSample(seq=1, seconds=0.002, num_bytes=24_772_608, num_descriptors=12, post_seconds=0.002),
        TransferSample(seq=2, seconds=0.003, num_bytes=24_772_608, num_descriptors=24, post_seconds=0.003),
    )
    assert log.drain_seconds() == (0.002, 0.003)
    assert log.drain_seconds() == ()  # handed out once; the total and the recent pulls stay
    assert log.seconds_total == pytest.approx(0.005)
    assert len(log.recent()) == 2


def test_multiconnector_children_count_once() -> None:
    # MultiConnector (NIXL + our kvtier connector): each child's stats under its name.
    sink = EngineStatsSink()
    sink._record_connector({"NixlConnector": _nixl([0.004], [1000], [12]), "SplitserveTierConnector": {}})
    log = sink.transfers
    assert (log.num_transfers, log.num_bytes, log.num_descriptors) == (1, 1000, 12)
