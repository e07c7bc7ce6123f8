"""OpenTelemetry spans of a request across processes (docs/fleet.md#traces).

Off unless the CLI called ``configure`` (``--otlp-traces-endpoint``, as vLLM names it): then every call here
returns at once, no OpenTelemetry module is imported and no object is made per request. On, a request's spans
form one trace: the frontend's root span, its admission wait and route, and one span per phase on the workers,
each process continuing the trace from the W3C ``traceparent`` carried in the wire messages (RouteRequest,
Generate).

The phases (``splitserve.phase``), in a disaggregated request's order: PHASES. Worker phases are recorded when the engine reports its times (the
engine's own monotonic clock, converted to wall time here).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# In a disaggregated request's order. The decode engine queues the request before it pulls: a decode slot and KV
# blocks must be free to receive the prompt's KV, so decode_queue comes before transfer.
PHASES = ("frontend_queue", "route", "prefill_queue", "prefill", "decode_queue", "transfer", "decode")
PHASE_ATTR = "splitserve.phase"

_tracer: Any = None  # an opentelemetry Tracer once configure() ran; None: tracing off
_NULL = contextlib.nullcontext()


def configure(tracer_provider: Any) -> None:
    """Turn tracing on with this provider (the CLI builds it once per process); None turns it off."""
    global _tracer
    _tracer = None if tracer_provider is None else tracer_provider.get_tracer("splitserve")


def enabled() -> bool:
    return _tracer is not None


def span(name: str, phase: str = "", **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span around the body, a child of the current one (a no-op context when tracing is off)."""
    if _tracer is None:
        return _NULL
    if phase:
        attributes[PHASE_ATTR] = phase
    return _tracer.start_as_current_span(name, attributes=attributes)


def traceparent() -> str:
    """The current span's W3C traceparent, for a wire message ("" when off or outside a span)."""
    if _tracer is None:
        return ""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent", "")


def remote_span(name: str, parent: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A server-side span continuing the trace of ``parent`` (a traceparent; "" or off: a no-op context)."""
    if _tracer is None or not parent:
        return _NULL
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract({"traceparent": parent})
    return _tracer.start_as_current_span(name, context=context, kind=SpanKind.SERVER, attributes=attributes)


@dataclass(frozen=True, slots=True)
class Phase:
    """A finished phase of a request in one process: monotonic seconds of this host."""

    name: str  # the span's name
    phase: str  # one of PHASES
    start_s: float
    end_s: float
    attributes: Mapping[str, Any] = field(default_factory=dict)


def record_remote(name: str, parent: str, start_s: float, end_s: float, phases: Sequence[Phase],
                  **attributes: Any) -> None:
    """A finished server span continuing ``parent`` (a traceparent), with one child span per phase; recorded once
    the request is done (its times are the engine's). Nothing when off or without a parent."""
    if _tracer is None or not parent:
        return
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract({"traceparent": parent})
    offset_ns = time.time_ns() - time.monotonic_ns()  # one conversion for all: phases that touch stay touching
    server = _tracer.start_span(name, context=context, kind=SpanKind.SERVER, start_time=_ns(start_s, offset_ns),
                                attributes=attributes)
    inside = trace.set_span_in_context(server)
    for p in phases:
        child = _tracer.start_span(p.name, context=inside, start_time=_ns(p.start_s, offset_ns),
                                   attributes={PHASE_ATTR: p.phase, **p.attributes})
        child.end(end_time=_ns(max(p.end_s, p.start_s), offset_ns))
    server.end(end_time=_ns(end_s, offset_ns))


def _ns(monotonic_s: float, offset_ns: int) -> int:
    """A monotonic time as epoch nanoseconds (what span times are), given wall minus monotonic clock."""
    return int(monotonic_s * 1e9) + offset_ns
