"""The session's one-engine reference (tests/e2e/reference.py) without an engine: which prompts it computes,
where, and when it starts one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import reference
from tests.e2e.reference import Reference


class FakeGraph:
    def __init__(self) -> None:
        self.asked: list[tuple[int, ...]] = []
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def started(monkeypatch) -> list[FakeGraph]:
    graphs: list[FakeGraph] = []

    def start_graph(*_args, **_kwargs) -> FakeGraph:
        graphs.append(FakeGraph())
        return graphs[-1]

    def complete(graph: FakeGraph, tokens: list[int]) -> tuple[str, int]:
        graph.asked.append(tuple(tokens))
        return f"out{tokens}", 16

    monkeypatch.setattr(reference, "start_graph", start_graph)
    monkeypatch.setattr(reference, "complete", complete)
    return graphs


def test_missing_prompts_start_one_engine_that_also_computes_extras_then_stops(started, tmp_path: Path) -> None:
    ref = Reference(tmp_path)
    assert ref.outputs([[1, 2], [3]], extra=[[4], [1, 2]]) == [("out[1, 2]", 16), ("out[3]", 16)]
    assert len(started) == 1 and started[0].stopped and started[0].asked == [(1, 2), (3,), (4,)]
    # All known now (an extra included): no engine.
    assert ref.outputs([[4], [3]]) == [("out[4]", 16), ("out[3]", 16)]
    assert len(started) == 1 and ref.num_starts == 1


def test_extras_alone_start_no_engine(started, tmp_path: Path) -> None:
    ref = Reference(tmp_path)
    assert ref.outputs([], extra=[[5]]) == []
    assert not started
    assert ref.outputs([[5]]) == [("out[5]", 16)]
    assert len(started) == 1


def test_a_callers_graph_computes_what_is_missing_and_is_not_stopped(started, tmp_path: Path) -> None:
    ref = Reference(tmp_path)
    ref.record([1], ("recorded", 16))
    own = FakeGraph()
    assert ref.outputs([[1]], extra=[[2]], graph=own) == [("recorded", 16)]  # type: ignore[arg-type]
    assert own.asked == [(2,)] and not own.stopped and not started
