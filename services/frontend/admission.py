"""The frontend's admission queue: which waiting request runs next, and which is shed under overload. Pure: no
clock, no asyncio (admission_gate.py waits on it); times are monotonic seconds passed in.

Order (docs/fleet.md#priority-and-fair-shares): the lowest ``priority`` value first (vLLM's convention), then
between tenants of that priority weighted fair queueing (the tenant with the least weighted service so far; a
tenant that comes back from idle starts level with the others, it banks no credit), then within the tenant the
earliest deadline (arrival + the TTFT budget of its priority). A full queue sheds the least important request of
all, the newcomer included: the highest priority value, then the tenant furthest over its share, then the
latest deadline. The shed one gets 429 when its tenant holds more than its share of the frontend, else 503. Slots may be
reserved for important requests (``reserved_inflight``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class AdmissionConfig:
    # Requests past admission (routed, prefilling, decoding) at once; more wait in the queue.
    max_inflight: int = 4096
    # Requests waiting for a slot; past it the least important is shed. 0: no queue (a request past max_inflight
    # is shed at once, the frontend's behaviour before the queue).
    max_queued: int = 0
    # Longest wait in the queue before a 503 (a request that waited this long has missed any TTFT goal).
    max_queue_wait_s: float = 30.0
    # Tenant -> weight (its share is weight / the weights of the tenants present); unlisted tenants weigh 1.
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    # (priority, TTFT budget s), ascending by priority: a priority's budget is that of the largest listed
    # priority at or below it, default_ttft_budget_s below them all. The deadline orders a tenant's requests.
    ttft_budgets_s: tuple[tuple[int, float], ...] = ()
    default_ttft_budget_s: float = 10.0
    # The last this-many of max_inflight slots only for requests of priority <= reserved_max_priority: a burst of
    # less important work never holds every slot, so an important request starts at once instead of waiting for
    # one to end (the frontend preempts nothing that runs).
    reserved_inflight: int = 0
    reserved_max_priority: int = 0

    def slots_for(self, priority: int) -> int:
        """Slots a request of ``priority`` may start in."""
        return self.max_inflight if priority <= self.reserved_max_priority else self.max_inflight - self.reserved_inflight

    def weight(self, tenant: str) -> float:
        return self.tenant_weights.get(tenant, 1.0)

    def ttft_budget_s(self, priority: int) -> float:
        budget = self.default_ttft_budget_s
        for level, level_budget_s in self.ttft_budgets_s:
            if level > priority:
                break
            budget = level_budget_s
        return budget


@dataclass(frozen=True, slots=True)
class Ticket:
    """One request asking in."""

    request_id: str
    tenant: str
    priority: int  # lower runs earlier
    arrival_s: float
    deadline_s: float


@dataclass(frozen=True, slots=True)
class Shed:
    ticket: Ticket
    status: Literal[429, 503]
    reason: str


@dataclass(frozen=True, slots=True)
class Arrival:
    """What an arriving ticket did: ``runs`` (a slot was free), else it waits unless it is in ``shed``."""

    runs: bool
    shed: tuple[Shed, ...] = ()


class AdmissionQueue:
    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.num_running = 0
        self._running_by_tenant: dict[str, int] = {}
        # priority -> tenant -> heap of (deadline_s, seq, ticket); emptied levels and tenants are removed.
        self._levels: dict[int, dict[str, list[tuple[float, int, Ticket]]]] = {}
        self._queued: dict[str, Ticket] = {}  # request_id -> ticket, for cancel and shedding
        self._queued_by_tenant: dict[str, int] = {}
        # Weighted service so far (requests started / weight): the fair-queueing clock of each tenant.
        self._served: dict[str, float] = {}
        self._seq = itertools.count()

    @property
    def num_queued(self) -> int:
        return len(self._queued)

    def ticket(self, request_id: str, tenant: str, priority: int, now_s: float) -> Ticket:
        return Ticket(request_id, tenant, priority, now_s, now_s + self.config.ttft_budget_s(priority))

    # ------------------------------------------------------------------------------------------- changes
    def arrive(self, ticket: Ticket) -> Arrival:
        if self.num_running < self.config.slots_for(ticket.priority) and not self._queued_at_or_before(ticket.priority):
            self._start(ticket)
            return Arrival(runs=True)
        self._push(ticket)
        if len(self._queued) <= self.config.max_queued:
            return Arrival(runs=False)
        # Full (or no queue at all: then the newcomer is the only one queued, and goes).
        shares = {t: self._over_share(t) for t in self._present()}
        victim = max(reversed(self._queued.values()),  # among equals the newest goes
                     key=lambda t: (t.priority, shares[t.tenant], t.deadline_s, t.arrival_s))
        shed = self._shed_status(victim, "server is at capacity" if self.config.max_queued <= 0
                                 else "queue is full")
        self._remove(victim)
        return Arrival(runs=False, shed=(shed,))

    def finish(self, tenant: str) -> list[Ticket]:
        """A running request of ``tenant`` ended; returns the queued tickets that start now."""
        self.num_running -= 1
        left = self._running_by_tenant[tenant] - 1
        if left:
            self._running_by_tenant[tenant] = left
        else:
            del self._running_by_tenant[tenant]
        return self.dispatch()

    def dispatch(self) -> list[Ticket]:
        started: list[Ticket] = []
        while self._queued and self.num_running < self.config.slots_for(min(self._levels)):
            ticket = self._pop_next()
            self._start(ticket)
            started.append(ticket)
        return started

    def cancel(self, request_id: str) -> bool:
        """A queued request left (client gone, waited too long). False when it is not queued."""
        ticket = self._queued.get(request_id)
        if ticket is None:
            return False
        self._remove(ticket)
        return True

    # ----------------------------------------------------------------------------------------- internals
    def _start(self, ticket: Ticket) -> None:
        self.num_running += 1
        self._running_by_tenant[ticket.tenant] = self._running_by_tenant.get(ticket.tenant, 0) + 1
        self._served[ticket.tenant] = self._served.get(ticket.tenant, 0.0) + 1.0 / self.config.weight(ticket.tenant)

    def _push(self, ticket: Ticket) -> None:
        tenants = self._levels.setdefault(ticket.priority, {})
        if ticket.tenant not in tenants:
            # Back from idle at this level: level with the busiest-served backlogged tenant's clock floor, so
            # idleness banks no credit (virtual-clock catch-up).
            floor = min((self._served.get(t, 0.0) for t in tenants), default=None)
            if floor is not None:
                self._served[ticket.tenant] = max(self._served.get(ticket.tenant, 0.0), floor)
            tenants[ticket.tenant] = []
        heapq.heappush(tenants[ticket.tenant], (ticket.deadline_s, next(self._seq), ticket))
        self._queued[ticket.request_id] = ticket
        self._queued_by_tenant[ticket.tenant] = self._queued_by_tenant.get(ticket.tenant, 0) + 1

    def _pop_next(self) -> Ticket:
        level = min(self._levels)
        tenants = self._levels[level]
        tenant = min(tenants, key=lambda t: (self._served.get(t, 0.0), tenants[t][0][0]))
        ticket = tenants[tenant][0][2]
        self._remove(ticket)
        return ticket

    def _remove(self, ticket: Ticket) -> None:
        del self._queued[ticket.request_id]
        if self._queued_by_tenant[ticket.tenant] == 1:
            del self._queued_by_tenant[ticket.tenant]
        else:
            self._queued_by_tenant[ticket.tenant] -= 1
        tenants = self._levels[ticket.priority]
        heap = tenants[ticket.tenant]
        heap.remove(next(entry for entry in heap if entry[2] is ticket))
        heapq.heapify(heap)
        if not heap:
            del tenants[ticket.tenant]
            if not tenants:
                del self._levels[ticket.priority]

    def _over_share(self, tenant: str) -> float:
        """How many times its fair share of the frontend (running + queued) the tenant holds."""
        present = self._present() | {tenant}
        total_weight = sum(self.config.weight(t) for t in present)
        capacity = self.config.max_inflight + self.config.max_queued
        fair = capacity * self.config.weight(tenant) / total_weight
        held = self._running_by_tenant.get(tenant, 0) + self._queued_by_tenant.get(tenant, 0)
        return held / max(fair, 1e-9)

    def _shed_status(self, ticket: Ticket, why: str) -> Shed:
        if self._over_share(ticket.tenant) > 1.0 and len(self._present()) > 1:
            return Shed(ticket, 429, f"tenant {ticket.tenant!r} is over its share of this server")
        return Shed(ticket, 503, f"{why}; retry shortly")

    def _queued_at_or_before(self, priority: int) -> bool:
        """Someone queued goes before a newcomer of ``priority`` (lower or equal values: they came first)."""
        return bool(self._levels) and min(self._levels) <= priority

    def _present(self) -> set[str]:
        return set(self._running_by_tenant) | set(self._queued_by_tenant)


def retry_after_s(num_queued: int, max_inflight: int, mean_service_s: float) -> int:
    """Seconds a shed client should wait: the queue ahead drained at max_inflight requests per mean service time,
    whole seconds in [1, 60] (HTTP's Retry-After)."""
    if mean_service_s <= 0 or max_inflight <= 0:
        return 1
    return max(1, min(60, math.ceil((num_queued + 1) * mean_service_s / max_inflight)))
