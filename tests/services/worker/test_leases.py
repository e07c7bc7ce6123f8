"""Leases: what a finished prefill's early KV release needs, kept only while its lease would hold the blocks."""

from __future__ import annotations

import pytest

from services.worker.leases import Leases


@pytest.mark.parametrize(
    ("held_at_s", "taken_at_s", "expected"),
    [
        (0.0, 0.0, "vllm-1"),  # at once
        (0.0, 29.9, "vllm-1"),  # just inside the 30 s lease
        (0.0, 30.0, None),  # the lease ran out: vLLM has freed the blocks itself
    ],
)
def test_take_within_the_lease(held_at_s: float, taken_at_s: float, expected: str | None) -> None:
    leases: Leases[str] = Leases()
    leases.hold("r1", "vllm-1", held_at_s, 30.0)
    assert leases.take("r1", taken_at_s) == expected


def test_taken_once() -> None:
    leases: Leases[str] = Leases()
    leases.hold("r1", "vllm-1", 0.0, 30.0)
    assert leases.take("r1", 1.0) == "vllm-1"
    assert leases.take("r1", 1.0) is None
    assert leases.take("never", 1.0) is None


def test_run_out_leases_are_forgotten() -> None:
    leases: Leases[str] = Leases()
    for i in range(100):
        leases.hold(f"r{i}", f"v{i}", float(i), 30.0)
    assert len(leases) == 30  # r0..r69 ran out by t=99
    leases.hold("r70", "again", 99.0, 30.0)  # a re-hold moves to the end: r71.. still run out in order
    assert leases.take("r71", 101.5) is None and leases.take("r70", 101.5) == "again"


def test_only_its_owner_takes_it() -> None:
    leases: Leases[bytes] = Leases()
    leases.hold("r1", b"frontend-a", 0.0, 30.0)
    assert leases.take("r1", 1.0, only=b"frontend-b") == b"frontend-a"  # refused: it stays held
    assert leases.take("r1", 1.0, only=b"frontend-a") == b"frontend-a"
    assert leases.take("r1", 1.0, only=b"frontend-a") is None
