"""Roles switched in place (``SetRole``): the router's check, and the switches it waits on.

A worker whose engine serves both sides of P/D (``WorkerInfo.switchable``: vLLM kv_both, the mock engine) moves
between the prefill and decode pools without a restart: its engine, KV cache and prefix index stay. The router
that gets ``SetRole`` checks it (``check_set_role``, pure), forwards it to the worker and answers the asker once
the worker confirmed. The worker is the source of truth for its role: it tells every router in its heartbeats
(``Heartbeat.role``) and registrations, so replicas and restarted routers agree. The old role's requests on the
worker finish there (the engine serves either kind; a prefill's KV stays leased until it is pulled); new work of
the new role goes to it as soon as the registry moved it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import structlog

from common.protocol import Message, Role, RoleSet, SetRole
from common.transport import new_id
from services.router.metrics import RouterMetrics
from services.router.registry import Registry, WorkerEntry

log = structlog.get_logger(__name__)

SWITCH_ROLES: tuple[Role, ...] = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class RoleCheck:
    ok: bool
    reason: str = ""
    # Already in that role: answered ok at once, nothing to forward.
    unchanged: bool = False


def pool_of(role: str) -> str:
    """The pool a role serves: "both" workers decode (and prefill their own prompts), so they are decode's."""
    return "prefill" if role == "prefill" else "decode"


def check_set_role(workers: Sequence[WorkerEntry], worker_id: str, role: str,
                   switching: Collection[str] = ()) -> RoleCheck:
    """May ``worker_id`` move to ``role`` now? ``switching``: workers with a switch in flight."""
    if role not in SWITCH_ROLES:
        return RoleCheck(False, f"role must be prefill or decode, not {role!r}")
    entry = next((e for e in workers if e.info.worker_id == worker_id), None)
    if entry is None:
        return RoleCheck(False, f"unknown worker {worker_id!r}")
    if entry.info.role == role:
        return RoleCheck(True, f"already {role}", unchanged=True)
    if not entry.info.switchable:
        return RoleCheck(False, "not switchable (its engine serves one side of P/D only)")
    if entry.draining:
        return RoleCheck(False, "draining")
    if worker_id in switching:
        return RoleCheck(False, "a switch of this worker is in progress")
    pool = pool_of(entry.info.role)
    if pool != pool_of(role) and not any(
            e.info.model == entry.info.model and e.info.worker_id != worker_id and not e.draining
            and pool_of(e.info.role) == pool for e in workers):
        return RoleCheck(False, f"last serving worker of the {pool} pool")
    return RoleCheck(True)


@dataclass(frozen=True, slots=True)
class PendingSwitch:
    requester: bytes  # the asker's identity on our ROUTER socket
    request_id: str  # the asker's request id (the worker gets one of ours)
    worker_id: str
    role: Role
    started_s: float  # monotonic, when we took the decision


class RoleSwitcher:
    """The switches this router forwarded and waits on; moves workers between pools as they report."""

    def __init__(self, registry: Registry, metrics: RouterMetrics, identities: dict[str, bytes],
                 send: Callable[[bytes, Message], None], timeout_s: float = 2.0) -> None:
        self._registry = registry
        self._metrics = metrics
        self._identities = identities  # worker id -> its link's identity on our socket (the service's map)
        self._send = send
        self._timeout_s = timeout_s
        self._pending: dict[str, PendingSwitch] = {}  # our forwarded request id -> the switch
        self._has_pending = asyncio.Event()  # wakes ``run`` from its idle sleep

    def request(self, identity: bytes, msg: SetRole, now_s: float) -> RoleSet | None:
        """An asker's ``SetRole``: refused or unchanged at once, else forwarded (answered in ``answered``)."""
        check = check_set_role(self._registry.workers(), msg.worker_id, msg.role,
                               {p.worker_id for p in self._pending.values()})
        worker = self._identities.get(msg.worker_id)
        if check.ok and not check.unchanged and worker is None:
            check = RoleCheck(False, "worker not reachable")
        if not check.ok or check.unchanged:
            self._metrics.role_switches.labels(result="unchanged" if check.ok else "refused").inc()
            if not check.ok:
                log.warning("role_switch_refused", worker_id=msg.worker_id, role=msg.role, reason=check.reason)
            entry = self._registry.get(msg.worker_id)
            return RoleSet(request_id=msg.request_id, worker_id=msg.worker_id,
                           role=entry.info.role if entry is not None else msg.role, ok=check.ok, reason=check.reason)
        assert worker is not None
        forwarded = new_id("role")
        self._pending[forwarded] = PendingSwitch(identity, msg.request_id, msg.worker_id, msg.role, now_s)
        self._has_pending.set()
        log.info("role_switch_started", worker_id=msg.worker_id, role=msg.role, reason=msg.reason)
        self._send(worker, SetRole(request_id=forwarded, worker_id=msg.worker_id, role=msg.role, reason=msg.reason))
        return None

    def answered(self, msg: RoleSet, now_s: float) -> None:
        """The worker's answer to a switch we forwarded: move it (if its heartbeat has not already) and answer."""
        pending = self._pending.pop(msg.request_id, None)
        if pending is None:
            return  # answered after we gave up on it: its heartbeats carry the role anyway
        if msg.ok:
            self.reported(msg.worker_id, msg.role)
        seconds = now_s - pending.started_s if msg.ok else 0.0
        self._metrics.role_switches.labels(result="ok" if msg.ok else "refused").inc()
        if msg.ok:
            self._metrics.role_switch_seconds.observe(seconds)
        log.info("role_switched" if msg.ok else "role_switch_refused", worker_id=msg.worker_id, role=msg.role,
                 seconds=round(seconds, 4), reason=msg.reason)
        self._send(pending.requester, RoleSet(request_id=pending.request_id, worker_id=msg.worker_id,
                                              role=msg.role, ok=msg.ok, reason=msg.reason, seconds=seconds))

    def reported(self, worker_id: str, role: str) -> None:
        """A worker's role as it says (heartbeat, switch answer): the registry follows it."""
        if role and self._registry.set_role(worker_id, role):  # type: ignore[arg-type]
            entry = self._registry.get(worker_id)
            assert entry is not None
            self._metrics.observe_worker(entry.info)
            log.info("worker_role_changed", worker_id=worker_id, role=role)

    def expire(self, now_s: float) -> None:
        """Answer the switches whose worker did not answer in time (it may be hung or gone)."""
        for forwarded, pending in list(self._pending.items()):
            if now_s - pending.started_s <= self._timeout_s:
                continue
            del self._pending[forwarded]
            self._metrics.role_switches.labels(result="timeout").inc()
            reason = f"worker did not answer within {self._timeout_s} s"
            log.warning("role_switch_timeout", worker_id=pending.worker_id, role=pending.role, reason=reason)
            entry = self._registry.get(pending.worker_id)
            self._send(pending.requester, RoleSet(
                request_id=pending.request_id, worker_id=pending.worker_id,
                role=entry.info.role if entry is not None else pending.role, ok=False, reason=reason))

    async def run(self, poll_s: float = 0.1) -> None:
        """Times out unanswered switches, polling only while one is pending (an idle router sleeps)."""
        while True:
            if not self._pending:
                self._has_pending.clear()
                await self._has_pending.wait()
            await asyncio.sleep(poll_s)
            self.expire(time.monotonic())
