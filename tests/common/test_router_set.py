"""Which router replica a frontend asks: the preferred one while up, else the next one up, else the first back."""

from __future__ import annotations

import pytest

from common.router_set import pick_router


@pytest.mark.parametrize(
    ("preferred", "down_until_s", "expected"),
    [
        (0, [0.0, 0.0, 0.0], 0),  # all up: the preferred one
        (1, [0.0, 0.0, 0.0], 1),
        (0, [12.0, 0.0, 0.0], 1),  # preferred down: the next in ring order
        (2, [0.0, 0.0, 12.0], 0),  # ... wrapping around
        (0, [12.0, 11.0, 0.0], 2),
        (0, [10.0, 0.0, 0.0], 0),  # a down mark that has ended (now = 10) counts as up
        (0, [13.0, 12.0, 14.0], 1),  # all down: the one back first
    ],
)
def test_pick_router(preferred: int, down_until_s: list[float], expected: int) -> None:
    assert pick_router(3, preferred, down_until_s, now_s=10.0) == expected
