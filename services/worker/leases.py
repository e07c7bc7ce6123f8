"""KV leases a finished prefill still holds for its decode, by request id, each until its lease runs out.

A prefill-only request finishes with its prompt's blocks kept for the decode engine (pull: until its READ is
done; push: until its WRITE into the decode engine is). When the decode is known not to come (the frontend
aborts the finished prefill: the decode worker refused it, or it could never be sent), the worker releases the
blocks at once instead of at the end of the lease. ``Leases`` remembers what that release needs (the worker: who
may ask for it; the vLLM engine: vLLM's own id of the request) and forgets each entry when its lease would
have run out anyway, so it never grows past the leases the engine holds.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")

# How long a finished prefill's frontend may still let its KV go (Abort): past the engines' lease (30 s by
# default), after which the engine has freed the blocks itself and the abort would find nothing.
HELD_PREFILL_S = 60.0


class Leases(Generic[T]):
    """request id -> (what its release needs, when its lease ends in monotonic seconds)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[T, float]] = {}

    def hold(self, request_id: str, value: T, now_s: float, lease_s: float) -> None:
        self._prune(now_s)
        self._held.pop(request_id, None)  # a re-hold goes to the end: the order stays the order of ends
        self._held[request_id] = (value, now_s + lease_s)

    def take(self, request_id: str, now_s: float, only: T | None = None) -> T | None:
        """What releasing ``request_id``'s lease needs, or None (never held, taken already, or run out). With
        ``only``, it is taken only if held with that value (a peer that may not release it leaves it held); the
        held value is returned either way."""
        self._prune(now_s)
        held = self._held.get(request_id)
        if held is None or now_s >= held[1]:
            return None
        if only is None or held[0] == only:
            del self._held[request_id]
        return held[0]

    def __len__(self) -> int:
        return len(self._held)

    def _prune(self, now_s: float) -> None:
        # Leases end in the order they began (one lease length for all), so the oldest come first.
        while self._held:
            request_id, (_, ends_s) = next(iter(self._held.items()))
            if now_s < ends_s:
                return
            del self._held[request_id]
