"""run_xfer: poll a NIXL transfer to its end, release the handle whatever happens (a scripted agent)."""

from __future__ import annotations

import pytest

from common.nixl import run_xfer


class _Agent:
    """Answers ``transfer`` then each ``check_xfer_state`` from a script (its last state repeats); records
    released handles."""

    def __init__(self, *states: str) -> None:
        self._states = list(states)
        self.released: list[object] = []

    def _next(self) -> str:
        return self._states.pop(0) if len(self._states) > 1 else self._states[0]

    def transfer(self, handle: object) -> str:
        return self._next()

    def check_xfer_state(self, handle: object) -> str:
        return self._next()

    def release_xfer_handle(self, handle: object) -> None:
        self.released.append(handle)


def test_polls_until_done_and_releases() -> None:
    agent = _Agent("PROC", "PROC", "DONE")
    run_xfer(agent, "h", timeout_s=5.0, what="READ of 2 blocks")
    assert agent.released == ["h"] and agent._states == ["DONE"]


def test_err_raises_oserror_naming_the_transfer_and_releases() -> None:
    agent = _Agent("PROC", "ERR")
    with pytest.raises(OSError, match="NIXL READ of 2 blocks failed"):
        run_xfer(agent, "h", timeout_s=5.0, what="READ of 2 blocks")
    assert agent.released == ["h"]


def test_a_transfer_that_never_ends_times_out_and_releases() -> None:
    agent = _Agent("PROC")  # PROC forever
    with pytest.raises(TimeoutError, match="NIXL POSIX WRITE of slot 3 timed out"):
        run_xfer(agent, "h", timeout_s=0.01, what="POSIX WRITE of slot 3")
    assert agent.released == ["h"]
