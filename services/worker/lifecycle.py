"""The worker's lifecycle decisions, pure: may it take a role a router forwards, and has its drain finished.

Times are monotonic seconds passed in, so each rule is a table test (tests/services/worker/test_lifecycle.py).
"""

from __future__ import annotations

from common.protocol import Role, WorkerLoad


def role_refusal(role: Role, switchable: bool, draining: bool) -> str:
    """Why a ``SetRole`` to ``role`` is refused, or "" when the worker takes it."""
    if role not in ("prefill", "decode"):
        return "role must be prefill or decode"
    if not switchable:
        return "not switchable"
    return "draining" if draining else ""


def drain_quiet_s(role: Role, quiet_s: float, transfer_grace_s: float) -> float:
    """How long a draining worker must have had no new request before it exits: a prefill worker also waits out
    the time a decode worker has to pull its last prefill's KV."""
    return quiet_s + (transfer_grace_s if role == "prefill" else 0.0)


def drained(num_requests: int, load: WorkerLoad, now_s: float, last_arrival_s: float, last_prefill_s: float,
            quiet_s: float, transfer_grace_s: float) -> bool:
    """A draining worker may exit: nothing runs or waits, its last prefill's KV had its grace to be pulled
    (a worker moved out of prefill may still hold some), and no request came for ``quiet_s``."""
    idle = num_requests == 0 and load.num_running == 0 and load.num_waiting == 0
    return idle and now_s - last_prefill_s >= transfer_grace_s and now_s - last_arrival_s >= quiet_s
