"""Per-source KV event numbering: in order, duplicate, restarted, or a gap that needs a snapshot (docs/architecture.md#contracts).

Each source (worker or kvtier) numbers its ``KvEvents`` batches from 0, +1 per batch, within an epoch: a random
number per publisher start. The tracker only judges (epoch, number) pairs and says which sources the router
may trust; the prefix index acts on its verdicts (apply, drop, buffer, ask for a ``KvSnapshot``).

Fail closed: a source awaiting a snapshot (registered just now, restarted under a new epoch mid-stream, or
after a gap) is not ``credited``: the router gives it no prefix credit until the snapshot is loaded, instead
of routing on a view it knows to be incomplete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# apply: next in order. duplicate: already seen, drop. restart: batch 0 of a new epoch (or, in epoch 0, the
# numbering back at 0): the source restarted, its old blocks are gone. gap: batches were lost, ask for a snapshot
# now. awaiting_snapshot: a snapshot was asked for and has not arrived; hold the batch for replay on top of it.
EventAction = Literal["apply", "duplicate", "restart", "gap", "awaiting_snapshot"]


@dataclass(frozen=True, slots=True)
class EventCheck:
    action: EventAction
    # The batch number that would have been in order (what the router expected from the source).
    expected_event_id: int
    # The source's epoch changed with this batch: whatever it held before is gone.
    new_epoch: bool = False

    @property
    def needs_snapshot(self) -> bool:
        """True exactly when the caller should send a ``KvSnapshotRequest`` now."""
        return self.action == "gap"


@dataclass(slots=True)
class _SourceState:
    last_event_id: int
    # None: not known yet (registered, no batch or snapshot seen).
    epoch: int | None = None
    # Batches held since the snapshot was asked for; None while in order.
    held_since_gap: int | None = None
    # When the snapshot was last asked for (monotonic s); None: not asked yet.
    asked_s: float | None = None


class EventTracker:
    def __init__(self, resnapshot_every: int = 64) -> None:
        # While waiting for a snapshot, ask again every this many held batches: the request or the reply
        # may have been lost, and a later snapshot supersedes an earlier one anyway.
        self.resnapshot_every = resnapshot_every
        self._sources: dict[str, _SourceState] = {}

    def expect_snapshot(self, source_id: str) -> None:
        """The source (re)registered: nothing it holds is known until its snapshot arrives (``due_snapshots``
        names it at once)."""
        self._sources[source_id] = _SourceState(last_event_id=-1, held_since_gap=0)

    def observe(self, source_id: str, event_id: int, epoch: int = 0) -> EventCheck:
        state = self._sources.get(source_id)
        if state is None:
            # A source we know nothing of: batch 0 is a clean start, anything later means we missed some
            # (the router restarted, or the source registered before we listened).
            if event_id == 0:
                self._sources[source_id] = _SourceState(last_event_id=0, epoch=epoch)
                return EventCheck("apply", 0)
            self._sources[source_id] = _SourceState(last_event_id=-1, epoch=epoch, held_since_gap=0)
            return EventCheck("gap", 0)
        if state.epoch is not None and epoch != state.epoch:
            # The publisher restarted: its old blocks (and batches held for the old epoch) are gone.
            if event_id == 0:
                self._sources[source_id] = _SourceState(last_event_id=0, epoch=epoch)
                return EventCheck("restart", 0, new_epoch=True)
            self._sources[source_id] = _SourceState(last_event_id=-1, epoch=epoch, held_since_gap=0)
            return EventCheck("gap", 0, new_epoch=True)
        state.epoch = epoch
        expected = state.last_event_id + 1
        if state.held_since_gap is not None:
            state.held_since_gap += 1
            if state.held_since_gap % self.resnapshot_every == 0:
                return EventCheck("gap", expected)
            return EventCheck("awaiting_snapshot", expected)
        if event_id == expected:
            state.last_event_id = event_id
            return EventCheck("apply", expected)
        if event_id == 0:
            state.last_event_id = 0
            return EventCheck("restart", expected)
        if event_id < expected:
            return EventCheck("duplicate", expected)
        state.held_since_gap = 0
        state.asked_s = None
        return EventCheck("gap", expected)

    def snapshot_fits(self, source_id: str, epoch: int) -> bool:
        """False for a snapshot of another epoch than the batches we hold (a restart crossed it): ask again."""
        state = self._sources.get(source_id)
        return state is None or state.epoch is None or state.epoch == epoch

    def snapshot_loaded(self, source_id: str, event_id: int, epoch: int = 0) -> None:
        """The source's state as of batch ``event_id`` is loaded; the next batch in order is event_id + 1."""
        self._sources[source_id] = _SourceState(last_event_id=event_id, epoch=epoch)

    def awaiting_snapshot(self, source_id: str) -> bool:
        state = self._sources.get(source_id)
        return state is not None and state.held_since_gap is not None

    def credited(self, source_id: str) -> bool:
        """May the router credit this source's blocks? Not while it awaits a snapshot (fail closed)."""
        return not self.awaiting_snapshot(source_id)

    def due_snapshots(self, now_s: float, retry_s: float) -> list[str]:
        """Sources awaiting a snapshot never asked for, or asked ``retry_s`` ago or longer (the request or
        its reply was lost, or the source was busy); marks them asked at ``now_s``."""
        due = []
        for source_id, state in self._sources.items():
            if state.held_since_gap is None:
                continue
            if state.asked_s is None or now_s - state.asked_s >= retry_s:
                state.asked_s = now_s
                due.append(source_id)
        return due

    def mark_asked(self, source_id: str, now_s: float) -> None:
        state = self._sources.get(source_id)
        if state is not None:
            state.asked_s = now_s

    def last_event_id(self, source_id: str) -> int | None:
        """The last batch applied in order; None for a source never seen (or forgotten)."""
        state = self._sources.get(source_id)
        return None if state is None else state.last_event_id

    def forget(self, source_id: str) -> None:
        self._sources.pop(source_id, None)
