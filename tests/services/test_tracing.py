"""One disaggregated request's trace: frontend, router, prefill worker and decode worker in this process on real
sockets, the trace context crossing each hop in the wire messages, spans read from an in-memory exporter: every
phase once, in order, all in one trace. And with tracing off, no span and no traceparent on the wire."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cli.ports import free_port
from common import tracing
from services.frontend.http import HttpConfig
from services.frontend.pipeline import PipelineConfig
from services.frontend.service import FrontendConfig, FrontendService
from services.router.policy import PolicyConfig
from services.router.service import RouterConfig, RouterService
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.engine import MockEngine
from services.worker.service import WorkerConfig, WorkerService
from tests.harness.graph import tiny_model_dir
from tests.services.frontend.http_client import WAIT_S, connect, read_reply

MODEL = "tiny"


@contextlib.asynccontextmanager
async def _graph():
    """Router, one prefill and one decode worker (mock), a frontend; every prompt is prefilled remotely."""
    router_endpoint = f"tcp://127.0.0.1:{free_port()}"
    router = RouterService(RouterConfig(endpoint=router_endpoint, policy=PolicyConfig(local_prefill_max_tokens=0)))
    frontend = FrontendService(FrontendConfig(
        model_name=MODEL, model_dir=tiny_model_dir(), http=HttpConfig(port=0),
        pipeline=PipelineConfig(router_endpoint=router_endpoint)))
    vocab_size = frontend.tokenizer.vocab_size
    workers = [WorkerService(WorkerConfig(worker_id=role, role=role, model=MODEL, router_endpoint=router_endpoint),
                             MockEngine(MockEngineConfig(num_blocks=256, engine_id=role, vocab_size=vocab_size)))
               for role in ("prefill", "decode")]
    ready = asyncio.Event()
    tasks = [asyncio.create_task(router.run(ready))]
    await asyncio.wait_for(ready.wait(), WAIT_S)
    tasks += [asyncio.create_task(w.run()) for w in workers]
    front_ready = asyncio.Event()
    tasks.append(asyncio.create_task(frontend.run(front_ready)))
    try:
        await asyncio.wait_for(front_ready.wait(), WAIT_S)
        for _ in range(250):
            if router.registry.get("prefill") is not None and router.registry.get("decode") is not None:
                break
            await asyncio.sleep(0.02)
        yield frontend, workers
    finally:
        for task in reversed(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _complete(port: int) -> int:
    reader, writer = await connect(port)
    body = json.dumps({"model": MODEL, "prompt": "the quick brown fox jumps over the lazy dog " * 8,
                       "max_tokens": 4}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    reply = await read_reply(reader)
    writer.close()
    return reply.status


@pytest.fixture
def exporter():
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.configure(provider)
    yield spans
    tracing.configure(None)
    provider.shutdown()


async def test_one_disaggregated_request_has_every_phase_once_in_order(exporter) -> None:
    async with _graph() as (frontend, workers):
        assert await _complete(frontend.port) == 200
        decode = workers[1]
        for _ in range(100):  # the decode worker records its spans as its request task ends
            if any(s.name == "worker.generate" for s in exporter.get_finished_spans()):
                break
            await asyncio.sleep(0.02)
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "request"]
    trace_id = root.context.trace_id
    assert {s.context.trace_id for s in spans} == {trace_id}  # one trace across all four services
    phases = sorted((s for s in spans if tracing.PHASE_ATTR in s.attributes), key=lambda s: (s.start_time, s.end_time))
    assert [s.attributes[tracing.PHASE_ATTR] for s in phases] == list(tracing.PHASES)
    for earlier, later in zip(phases, phases[1:]):
        # Phases follow each other (ns; 1 ms for the clock conversions of different processes).
        assert earlier.end_time <= later.start_time + 1_000_000
    by_id = {s.context.span_id: s for s in spans}

    def parent(span):
        return by_id[span.parent.span_id].name

    kinds = {s.attributes[tracing.PHASE_ATTR]: s for s in phases}
    assert parent(kinds["frontend_queue"]) == "request" and parent(kinds["route"]) == "request"
    (router_span,) = [s for s in spans if s.name == "router.route"]
    assert parent(router_span) == "route"
    assert parent(kinds["prefill_queue"]) == parent(kinds["prefill"]) == "worker.prefill"
    assert {parent(kinds[p]) for p in ("decode_queue", "transfer", "decode")} == {"worker.generate"}
    assert parent(by_id[kinds["prefill"].parent.span_id]) == "request"  # the workers continue the frontend's span
    # The mock moved no byte: its transfer says so.
    assert kinds["transfer"].attributes.get("splitserve.simulated") is True
    assert decode.transfers_simulated


async def test_off_sends_no_traceparent_and_makes_no_span(monkeypatch) -> None:
    tracing.configure(None)
    seen: list[str] = []
    real = WorkerService._dispatch

    def spy(self, identity, msg):
        seen.append(getattr(msg, "traceparent", "-"))
        return real(self, identity, msg)

    monkeypatch.setattr(WorkerService, "_dispatch", spy)
    async with _graph() as (frontend, _):
        assert await _complete(frontend.port) == 200
    assert "" in seen and set(seen) <= {"", "-"}  # Generate messages carried an empty traceparent
    assert tracing.span("x") is tracing.span("y")  # the shared no-op context: nothing made per request
