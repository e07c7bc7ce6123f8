"""Retry delays: exponential steps, capped, half fixed and half jittered."""

from __future__ import annotations

import pytest

from common.backoff import Backoff, backoff_s


@pytest.mark.parametrize(("attempt", "rand", "expected"), [
    (1, 0.0, 0.05), (1, 0.5, 0.075), (1, 0.999, 0.09995),
    (2, 0.0, 0.1), (3, 0.0, 0.2), (5, 0.0, 0.8),
    (6, 0.0, 1.0), (6, 0.5, 1.5), (50, 0.0, 1.0),  # capped at max_s = 2.0
    (0, 0.0, 0.05),                                 # never below the first step
])
def test_backoff_s(attempt: int, rand: float, expected: float) -> None:
    assert backoff_s(attempt, base_s=0.1, max_s=2.0, rand=lambda: rand) == pytest.approx(expected)


def test_two_retriers_do_not_move_in_lockstep() -> None:
    import random

    a, b = Backoff(0.1, 2.0, random.Random(1).random), Backoff(0.1, 2.0, random.Random(2).random)
    assert [a.next_s() for _ in range(5)] != [b.next_s() for _ in range(5)]


def test_reset_starts_over() -> None:
    backoff = Backoff(0.1, 2.0, lambda: 0.0)
    assert [backoff.next_s() for _ in range(3)] == pytest.approx([0.05, 0.1, 0.2])
    backoff.reset()
    assert backoff.next_s() == pytest.approx(0.05)
