"""Per-source KV event numbering: in order, duplicate, restarted, or a gap that needs a snapshot (docs/architecture.md#contracts).

Each source (worker or kvtier) numbers its ``KvEvents`` batches from 0, +1 per batch. The tracker only
judges numbers; the prefix index acts on its verdicts (apply, drop, buffer, ask for a ``KvSnapshot``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# apply: next in order. duplicate: already seen, drop. restart: the source numbers from 0 again (it
# restarted, its old blocks are gone). gap: batches were lost, ask for a snapshot now. awaiting_snapshot:
# a snapshot was asked for and has not arrived; hold the batch for replay on top of it.
EventAction = Literal["apply", "duplicate", "restart", "gap", "awaiting_snapshot"]


@dataclass(frozen=True, slots=True)
class EventCheck:
    action: EventAction
    # The batch number that would have been in order (what the router expected from the source).
    expected_event_id: int

    @property
    def needs_snapshot(self) -> bool:
        """True exactly when the caller should send a ``KvSnapshotRequest`` now."""
        return self.action == "gap"


@dataclass(slots=True)
class _SourceState:
    last_event_id: int
    # Batches held since the snapshot was asked for; None while in order.
    held_since_gap: int | None = None


class EventTracker:
    def __init__(self, resnapshot_every: int = 64) -> None:
        # While waiting for a snapshot, ask again every this many held batches: the request or the reply
        # may have been lost, and a later snapshot supersedes an earlier one anyway.
        self.resnapshot_every = resnapshot_every
        self._sources: dict[str, _SourceState] = {}

    def observe(self, source_id: str, event_id: int) -> EventCheck:
        state = self._sources.get(source_id)
        if state is None:
            # A source we know nothing of: batch 0 is a clean start, anything later means we missed some
            # (the router restarted, or the source registered before we listened).
            if event_id == 0:
                self._sources[source_id] = _SourceState(last_event_id=0)
                return EventCheck("apply", 0)
            self._sources[source_id] = _SourceState(last_event_id=-1, held_since_gap=0)
            return EventCheck("gap", 0)
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
        return EventCheck("gap", expected)

    def snapshot_loaded(self, source_id: str, event_id: int) -> None:
        """The source's state as of batch ``event_id`` is loaded; the next batch in order is event_id + 1."""
        self._sources[source_id] = _SourceState(last_event_id=event_id)

    def awaiting_snapshot(self, source_id: str) -> bool:
        state = self._sources.get(source_id)
        return state is not None and state.held_since_gap is not None

    def last_event_id(self, source_id: str) -> int | None:
        """The last batch applied in order; None for a source never seen (or forgotten)."""
        state = self._sources.get(source_id)
        return None if state is None else state.last_event_id

    def forget(self, source_id: str) -> None:
        self._sources.pop(source_id, None)
