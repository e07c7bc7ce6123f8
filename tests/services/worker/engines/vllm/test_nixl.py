"""The NIXL progress thread by the engine's side of a READ (services/worker/engines/vllm/nixl.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from services.worker.engines.vllm.nixl import TARGET_DELAY_US, ProgressThread, progress_thread_for  # noqa: E402


@pytest.mark.parametrize(
    ("kv_role", "expected"),
    [
        ("kv_consumer", ProgressThread(enabled=False)),  # decode: drives its own READs, a thread would contend
        ("kv_producer", ProgressThread(enabled=True, delay_us=TARGET_DELAY_US)),  # prefill: READs wait on it
        ("kv_both", ProgressThread(enabled=True, delay_us=TARGET_DELAY_US)),
        (None, ProgressThread(enabled=True, delay_us=TARGET_DELAY_US)),
    ],
)
def test_progress_thread_by_role(kv_role: str | None, expected: ProgressThread) -> None:
    assert progress_thread_for(kv_role) == expected
