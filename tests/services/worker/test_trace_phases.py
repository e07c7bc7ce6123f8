"""A worker's phases of one request from the times it and its engine saw (the trace spans' intervals)."""

from __future__ import annotations

import pytest

from services.worker.trace_phases import UNREPORTED, worker_phases


@pytest.mark.parametrize("prefill_only, kv_transfer, times, expected", [
    # times: (arrival, scheduled, loaded, first token, end); expected (phase, start, end)
    (True, False, (1.0, 2.0, 0.0, 5.0, 5.0), [("prefill_queue", 1.0, 2.0), ("prefill", 2.0, 5.0)]),
    (False, True, (1.0, 1.5, 3.0, 3.5, 9.0),
     [("decode_queue", 1.0, 1.5), ("transfer", 1.5, 3.0), ("decode", 3.0, 9.0)]),
    (False, False, (1.0, 2.0, 0.0, 4.0, 9.0),
     [("decode_queue", 1.0, 2.0), ("prefill", 2.0, 4.0), ("decode", 4.0, 9.0)]),
    # The engine reported nothing (vLLM): an empty queue, the transfer up to the first token.
    (False, True, (1.0, 0.0, 0.0, 4.0, 9.0),
     [("decode_queue", 1.0, 1.0), ("transfer", 1.0, 4.0), ("decode", 4.0, 9.0)]),
    # Nothing came out (aborted in the queue): every phase ends at the end.
    (True, False, (1.0, 0.0, 0.0, 0.0, 3.0), [("prefill_queue", 1.0, 1.0), ("prefill", 1.0, 3.0)]),
])
def test_phases(prefill_only, kv_transfer, times, expected) -> None:
    phases = worker_phases(prefill_only, kv_transfer, *times)
    assert [(p.phase, p.start_s, p.end_s) for p in phases] == expected


def test_unreported_and_simulated_say_so() -> None:
    queue, transfer, _ = worker_phases(False, True, 1.0, 0.0, 0.0, 4.0, 9.0, transfer_simulated=True)
    assert dict(queue.attributes) == UNREPORTED
    assert transfer.attributes == {**UNREPORTED, "splitserve.simulated": True}
    queue, transfer, _ = worker_phases(False, True, 1.0, 2.0, 3.0, 4.0, 9.0)
    assert queue.attributes == {} and transfer.attributes == {}
