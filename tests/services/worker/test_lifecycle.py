"""The worker's lifecycle rules: which SetRole it takes, when a drain is done."""

from __future__ import annotations

import pytest

from common.protocol import WorkerLoad
from services.worker.lifecycle import drain_quiet_s, drained, role_refusal


@pytest.mark.parametrize(("role", "switchable", "draining", "expected"), [
    ("decode", True, False, ""),
    ("prefill", True, False, ""),
    ("both", True, False, "role must be prefill or decode"),
    ("decode", False, False, "not switchable"),
    ("decode", True, True, "draining"),
])
def test_role_refusal(role, switchable, draining, expected) -> None:
    assert role_refusal(role, switchable, draining) == expected


def test_a_prefill_worker_waits_out_the_pull_grace_too() -> None:
    assert drain_quiet_s("prefill", 0.5, 2.0) == 2.5
    assert drain_quiet_s("decode", 0.5, 2.0) == 0.5


IDLE = WorkerLoad()


@pytest.mark.parametrize(("num_requests", "load", "now_s", "last_arrival_s", "last_prefill_s", "expected"), [
    (0, IDLE, 10.0, 9.0, float("-inf"), True),  # idle, quiet for 1 s, never prefilled
    (1, IDLE, 10.0, 9.0, float("-inf"), False),  # a request still streams
    (0, WorkerLoad(num_running=1), 10.0, 9.0, float("-inf"), False),  # the engine still runs one
    (0, WorkerLoad(num_waiting=1), 10.0, 9.0, float("-inf"), False),
    (0, IDLE, 10.0, 9.8, float("-inf"), False),  # a request came 0.2 s ago
    (0, IDLE, 10.0, 5.0, 9.0, False),  # its last prefill's KV may still be pulled (grace 2 s)
    (0, IDLE, 10.0, 5.0, 8.0, True),
])
def test_drained(num_requests, load, now_s, last_arrival_s, last_prefill_s, expected) -> None:
    assert drained(num_requests, load, now_s, last_arrival_s, last_prefill_s, quiet_s=0.5,
                   transfer_grace_s=2.0) is expected
