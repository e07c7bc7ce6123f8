"""Effective load: the last report plus what was routed since, until the next report replaces the guess."""

from __future__ import annotations

import pytest

from common.protocol import WorkerInfo, WorkerLoad
from services.router.registry import Registry


def _registry(load: WorkerLoad) -> Registry:
    registry = Registry()
    registry.register(WorkerInfo(worker_id="w", role="prefill", model="m", block_size=16, num_blocks=10,
                                 endpoint="tcp://127.0.0.1:1"), now_s=0.0)
    registry.report("w", load, now_s=1.0)
    return registry


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        # The engine counts queued tokens: routed prompts add theirs.
        (WorkerLoad(num_waiting=1, num_waiting_tokens=300), (3, 800)),
        # It does not (-1): only the request count grows; the cost estimates tokens from it.
        (WorkerLoad(num_waiting=1), (3, -1)),
    ],
)
def test_routed_requests_and_tokens_count_until_the_next_report(reported: WorkerLoad, expected: tuple) -> None:
    registry = _registry(reported)
    registry.note_routed("w", 500)
    registry.note_routed("w")  # a decode-side route: no prompt to compute here
    entry = registry.get("w")
    assert entry is not None
    load = registry.effective_load(entry)
    assert (load.num_waiting, load.num_waiting_tokens) == expected
    registry.report("w", reported, now_s=2.0)
    entry = registry.get("w")
    assert entry is not None and registry.effective_load(entry) == reported
