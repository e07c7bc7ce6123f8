"""The frontend service in this process, with no router behind it: what it answers before any worker is asked
(size bounds, validation, auth, metrics labels, HEAD) and what stays off its event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import types

import structlog

from tests.harness.graph import tiny_model_dir
from cli.ports import free_port
from services.frontend.http import HttpConfig
from services.frontend.pipeline import PipelineConfig
from services.frontend.service import FrontendConfig, FrontendService
from tests.services.frontend.http_client import WAIT_S, Reply, connect, read_reply

MODEL = "tiny"


@contextlib.asynccontextmanager
async def frontend(**config):
    # Nothing listens on the router port: requests that pass validation fail fast with a 503.
    pipeline = PipelineConfig(router_endpoint=f"tcp://127.0.0.1:{free_port()}", route_timeout_s=0.2,
                              no_worker_wait_s=0.0)
    service = FrontendService(FrontendConfig(model_name=MODEL, model_dir=tiny_model_dir(), pipeline=pipeline,
                                             http=HttpConfig(port=0), **config))
    ready = asyncio.Event()
    task = asyncio.get_running_loop().create_task(service.run(ready))
    await asyncio.wait_for(ready.wait(), WAIT_S)
    try:
        yield service
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def call(service: FrontendService, method: str, path: str, body: bytes = b"",
               headers: dict[str, str] | None = None) -> Reply:
    reader, writer = await connect(service.port)
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: a\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body)
    reply = await read_reply(reader, head_only=method == "HEAD")
    writer.close()
    return reply


def chat(content: str, **extra) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4,
                       **extra}).encode()


async def test_huge_prompt_is_refused_before_any_template_or_tokenizer_work() -> None:
    async with frontend() as service:
        def must_not_run(*_a, **_k):
            raise AssertionError("templated or tokenized a prompt that cannot fit")

        service.tokenizer.apply_chat_template = must_not_run
        service.tokenizer.encode = must_not_run
        reply = await call(service, "POST", "/v1/chat/completions", chat("word " * 1_400_000))  # 7 MB
        assert reply.status == 400
        assert json.loads(reply.body)["error"]["code"] == "context_length_exceeded"
        reply = await call(service, "POST", "/v1/completions",
                           json.dumps({"model": MODEL, "prompt": "word " * 1_400_000}).encode())
        assert reply.status == 400


async def test_long_prompts_are_tokenized_off_the_event_loop() -> None:
    async with frontend() as service:
        loop_thread = threading.current_thread()
        seen: list[threading.Thread] = []
        real = service.tokenizer.apply_chat_template

        def record(messages, **kwargs):
            seen.append(threading.current_thread())
            return real(messages, **kwargs)

        service.tokenizer.apply_chat_template = record
        await call(service, "POST", "/v1/chat/completions", chat("a fox jumps"))
        assert seen == [loop_thread]  # short: a hand-off would cost more than the work
        long_text = "a fox jumps " * (service.tokenizer.offload_min_chars // 12 + 1)
        await call(service, "POST", "/v1/chat/completions", chat(long_text))
        assert len(seen) == 2 and seen[1] is not loop_thread


async def test_seed_outside_64_bits_and_deep_nesting_are_400() -> None:
    async with frontend() as service:
        for body in (chat("hi", seed=2**70), chat("hi", seed=-(2**64))):
            reply = await call(service, "POST", "/v1/chat/completions", body)
            assert reply.status == 400, reply.body
            assert json.loads(reply.body)["error"]["param"] == "seed"
        nested = chat("hi")[:-1] + b', "logprobs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        reply = await call(service, "POST", "/v1/chat/completions", nested)
        assert reply.status == 400, reply.body


async def test_metric_labels_never_come_from_the_client() -> None:
    async with frontend(api_key="sekrit") as service:
        for i in range(20):
            await call(service, "GET", f"/v1/random-{i}")
            await call(service, "POST", f"/nope/{i}", b"{}", {"authorization": "Bearer sekrit"})
        metrics = (await call(service, "GET", "/metrics")).body.decode()
        assert "random-" not in metrics and "/nope" not in metrics
        assert 'endpoint="other",status="401"' in metrics
        assert 'endpoint="other",status="404"' in metrics
        assert "splitserve_frontend_event_loop_lag_seconds_count" in metrics


async def test_api_key_guards_everything_but_the_open_paths() -> None:
    async with frontend(api_key="sekrit") as service:
        assert (await call(service, "GET", "/dashboard/data")).status == 401
        assert (await call(service, "GET", "/v1/models", headers={"authorization": "Bearer sekri"})).status == 401
        assert (await call(service, "GET", "/v1/models", headers={"authorization": "Bearer sekrit"})).status == 200
        assert (await call(service, "GET", "/metrics")).status == 200
        assert (await call(service, "GET", "/health")).status == 503  # open, and no workers behind it
    async with frontend(api_key="sekrit", open_paths=()) as service:
        assert (await call(service, "GET", "/metrics")).status == 401


async def test_head_on_a_get_route() -> None:
    async with frontend() as service:
        reply = await call(service, "HEAD", "/v1/models")
        assert reply.status == 200 and int(reply.headers["content-length"]) > 0


async def test_handler_crash_logs_one_line_without_traceback() -> None:
    async with frontend() as service:
        def boom(workers=None):
            raise RuntimeError("models table exploded")

        service._served_models = types.SimpleNamespace(listing=boom)
        with structlog.testing.capture_logs() as logs:
            reply = await call(service, "GET", "/v1/models", headers={"authorization": "Bearer k"})
        assert reply.status == 500
        crashes = [e for e in logs if e["event"] == "handler_crashed"]
        assert crashes == [{"event": "handler_crashed", "log_level": "error", "error_type": "RuntimeError",
                            "error": "models table exploded"}]


async def test_a_crash_after_the_stream_started_ends_it_in_band_not_with_a_second_response() -> None:
    from tests.services.frontend.http_client import closed

    async with frontend() as service:
        async def streams_then_crashes(resp):
            resp.start(200, b"text/event-stream")
            await resp.write(b'data: {"choices": []}\n\n')
            raise RuntimeError("renderer exploded mid-stream")

        service._health = streams_then_crashes
        reader, writer = await connect(service.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n")
        reply = await read_reply(reader)
        assert reply.status == 200 and reply.headers["transfer-encoding"] == "chunked"
        events = [e for e in reply.body.decode().split("\n\n") if e]
        assert events[0] == 'data: {"choices": []}' and events[-1] == "data: [DONE]"
        assert json.loads(events[1].removeprefix("data: "))["error"]["type"] == "server_error"
        # Nothing after the chunked body's end (no "HTTP/1.1 500" inside it), and the connection is closed.
        assert await closed(reader)
        writer.close()
