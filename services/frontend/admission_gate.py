"""The admission queue (admission.py) on the event loop: a request waits for its slot, or is shed as an
OpenAI-shaped 429/503 with Retry-After. Also where a request's priority and tenant are read off it, and where its
trace starts (the root span and the frontend_queue phase)."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec

from common import tracing
from services.frontend.admission import DEFAULT_TENANT, AdmissionConfig, AdmissionQueue, Shed, retry_after_s
from services.frontend.openai_api import PRIORITY_MAX, PRIORITY_MIN, ApiError, Priority

# Header names (lower case, as http.py keys them).
PRIORITY_HEADER = "x-priority"
TENANT_HEADER = "x-tenant"

# The admitted request's priority, for its SamplingParams (the engine's own priority scheduling): set by
# ``admitted`` in the request's task, read where the sampling is built.
current_priority: contextvars.ContextVar[int] = contextvars.ContextVar("current_priority", default=0)


class _Priority(msgspec.Struct):
    priority: Priority | None = None


_sniff = msgspec.json.Decoder(_Priority)


def body_priority(body: bytes) -> int | None:
    """The body's top-level ``priority``, read before the full parse (which reports a malformed body)."""
    if b'"priority"' not in body:  # memchr-fast: most requests carry none
        return None
    try:
        return _sniff.decode(body).priority
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):  # deep nesting: msgspec's own limit
        return None


def request_priority(body_priority: int | None, headers: dict[str, str]) -> int:
    """The body's ``priority`` (vLLM's field) when given, else the x-priority header, else 0."""
    if body_priority is not None:
        return body_priority
    text = headers.get(PRIORITY_HEADER, "").strip()
    if not text:
        return 0
    try:
        priority = int(text)
    except ValueError:
        priority = None
    if priority is None or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ApiError(400, f"{PRIORITY_HEADER} must be an integer in [{PRIORITY_MIN}, {PRIORITY_MAX}], not "
                       f"{text[:40]!r}", param=PRIORITY_HEADER)
    return priority


def request_tenant(headers: dict[str, str]) -> str:
    """x-tenant when sent, else one tenant per API key (named by a digest: keys never reach logs or metrics)."""
    tenant = headers.get(TENANT_HEADER, "").strip()
    if tenant:
        return tenant[:64]
    auth = headers.get("authorization", "")
    if auth:
        return "key-" + hashlib.sha256(auth.encode("latin-1", "replace")).hexdigest()[:12]
    return DEFAULT_TENANT


class AdmissionGate:
    def __init__(self, config: AdmissionConfig) -> None:
        self.queue = AdmissionQueue(config)
        self._waiting: dict[str, asyncio.Future[None]] = {}
        # Seconds a request held its slot, smoothed: what Retry-After estimates the queue's drain from.
        self._mean_service_s = 1.0
        self._ids = itertools.count()

    @asynccontextmanager
    async def admitted(self, path: str, body: bytes, headers: dict[str, str]) -> AsyncIterator[None]:
        """A generate request's whole life: its root span, its wait for a slot (frontend_queue), its priority."""
        priority = request_priority(body_priority(body), headers)
        tenant = request_tenant(headers)
        with tracing.span("request", path=path, tenant=tenant, priority=priority):
            async with self.slot("", tenant, priority):
                token = current_priority.set(priority)
                try:
                    yield
                finally:
                    current_priority.reset(token)

    @asynccontextmanager
    async def slot(self, request_id: str, tenant: str, priority: int) -> AsyncIterator[None]:
        """Holds a slot for the body; raises ApiError (429/503) when this request is shed."""
        ticket = self.queue.ticket(request_id or f"q{next(self._ids)}", tenant, priority, time.monotonic())
        with tracing.span("frontend.queue", phase="frontend_queue"):
            arrival = self.queue.arrive(ticket)
            for shed in arrival.shed:
                self._refuse(shed)
            if any(s.ticket is ticket for s in arrival.shed):
                raise self._error(next(s for s in arrival.shed if s.ticket is ticket))
            if not arrival.runs:
                await self._wait(ticket.request_id, tenant)
        start_s = time.monotonic()
        try:
            yield
        finally:
            self._mean_service_s = 0.9 * self._mean_service_s + 0.1 * (time.monotonic() - start_s)
            for started in self.queue.finish(tenant):
                self._waiting.pop(started.request_id).set_result(None)

    async def _wait(self, request_id: str, tenant: str) -> None:
        future = self._waiting[request_id] = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(future), self.queue.config.max_queue_wait_s)
        except TimeoutError:
            if self.queue.cancel(request_id):
                self._waiting.pop(request_id, None)
                raise self._error_of(503, "waited too long in the admission queue") from None
            await future  # started (or shed) just as the wait ran out
        except asyncio.CancelledError:  # client gone while queued: its place goes to the next one
            if self.queue.cancel(request_id):
                self._waiting.pop(request_id, None)
            elif future.done() and future.exception() is None:  # started as it left: the slot goes on
                for started in self.queue.finish(tenant):
                    self._waiting.pop(started.request_id).set_result(None)
            raise

    def _refuse(self, shed: Shed) -> None:
        """A queued request is shed to make room: its waiter raises the error."""
        future = self._waiting.pop(shed.ticket.request_id, None)
        if future is not None:
            future.set_exception(self._error(shed))

    def _error(self, shed: Shed) -> ApiError:
        return self._error_of(shed.status, shed.reason)

    def _error_of(self, status: int, reason: str) -> ApiError:
        wait_s = retry_after_s(self.queue.num_queued, self.queue.config.max_inflight, self._mean_service_s)
        return ApiError(status, reason, code="tenant_over_share" if status == 429 else "overloaded",
                        type_="rate_limit_error" if status == 429 else "server_error",
                        headers=((b"retry-after", str(wait_s).encode()),))
