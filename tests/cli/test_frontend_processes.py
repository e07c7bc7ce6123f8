"""`splitserve frontend --processes N`: each copy's identity and metrics port, and when the supervisor gives up."""

from __future__ import annotations

import pytest

from cli.frontend_processes import PROCESS_INDEX_ENV, copy_metrics_port, gives_up, process_index


@pytest.mark.parametrize(
    ("metrics_port", "index", "expected"),
    [(9300, 0, 9300), (9300, 3, 9303), (0, 2, 0), (9300, None, 9300), (0, None, 0)],
)
def test_each_copy_gets_its_own_metrics_port(metrics_port: int, index: int | None, expected: int) -> None:
    assert copy_metrics_port(metrics_port, index) == expected


@pytest.mark.parametrize(
    ("restarts", "now", "expected"),
    [
        ([], 100.0, False),
        ([99.0, 98.0, 97.0, 96.0, 95.0], 100.0, True),  # a sixth restart in a minute: more than 5
        ([99.0, 98.0, 97.0, 96.0], 100.0, False),  # the fifth is still made
        ([10.0, 11.0, 12.0, 13.0, 14.0], 100.0, False),  # older than a minute: forgotten
    ],
)
def test_supervisor_gives_up_on_a_crash_loop(restarts: list[float], now: float, expected: bool) -> None:
    assert gives_up(restarts, now, max_per_min=5) is expected


def test_process_index_comes_from_the_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROCESS_INDEX_ENV, raising=False)
    assert process_index() is None
    monkeypatch.setenv(PROCESS_INDEX_ENV, "2")
    assert process_index() == 2
