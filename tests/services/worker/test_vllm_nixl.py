"""The NIXL progress thread's delay by the engine's side of a READ (services/worker/vllm_nixl.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from services.worker.vllm_nixl import INITIATOR_DELAY_US, TARGET_DELAY_US, progress_delay_us  # noqa: E402


@pytest.mark.parametrize(
    ("kv_role", "delay_us"),
    [
        ("kv_consumer", INITIATOR_DELAY_US),  # decode: drives its own READs, the thread would contend
        ("kv_producer", TARGET_DELAY_US),  # prefill: others' READs wait on its progress
        ("kv_both", TARGET_DELAY_US),
        (None, TARGET_DELAY_US),
    ],
)
def test_progress_delay_by_role(kv_role: str | None, delay_us: int) -> None:
    assert progress_delay_us(kv_role) == delay_us
    assert TARGET_DELAY_US < INITIATOR_DELAY_US
