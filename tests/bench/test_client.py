"""bench/lib/client.py against raw HTTP answers shaped like ours, vLLM's and Dynamo's: framing, 1xx, SSE rules."""

from __future__ import annotations

import asyncio
import json

import pytest

from bench.lib.client import Client, StreamResult


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"


def _event(obj, eol: bytes = b"\n") -> bytes:
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return b"data: " + data + eol + eol


def _text(t: str) -> dict:
    return {"choices": [{"index": 0, "text": t}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3,
                                  "prompt_tokens_details": {"cached_tokens": 2}}}


async def _serve(writes: list[bytes], body: dict | None = None) -> StreamResult:
    """One server answering one POST with ``writes`` (each its own TCP write, a little apart)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            for w in writes:
                writer.write(w)
                await writer.drain()
                await asyncio.sleep(0.01)
        except (asyncio.CancelledError, ConnectionError):  # the client gave up: nothing left to answer
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Client(f"http://127.0.0.1:{port}")
    try:
        return await client.stream("/v1/completions", body or {"prompt": [1], "stream": True}, 5.0)
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()


def run(writes: list[bytes]) -> StreamResult:
    return asyncio.run(_serve(writes))


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def test_chunked_stream_with_events_split_across_chunks_and_a_100_continue():
    body = _event(_text("a")) + _event(_text("bc")) + _event(USAGE) + _event(b"[DONE]")
    # Chunk boundaries fall inside events and inside the JSON; a 100 Continue comes before the answer.
    pieces = [body[:7], body[7:30], body[30:31], body[31:]]
    res = run([b"HTTP/1.1 100 Continue\r\n\r\n", HEAD + _chunked(*pieces)[:20], _chunked(*pieces)[20:]])
    assert res.ok and res.done and res.status == 200, res.error
    assert res.chunk_tokens == [1, 1] and len(res.chunk_times_s) == 2
    assert (res.prompt_tokens, res.completion_tokens, res.cached_tokens) == (5, 3, 2)
    assert res.num_events == 4
    # the final usage reports 3 tokens for 2 text chunks: the third counts with the last chunk
    assert res.timing().chunk_tokens == [1, 2] and res.timing().itl_s()[1] == 0.0


def test_content_length_body_crlf_lines_comments_and_multiline_data():
    text = json.dumps(USAGE)
    cut = text.index('"usage"')  # between two members, where the joining newline is white space
    usage_lines = b"data: " + text[:cut].encode() + b"\r\ndata: " + text[cut:].encode()
    body = (b": keep-alive\r\n\r\n" + b"event: message\r\n" + _event(_text("x"), b"\r\n") + usage_lines + b"\r\n\r\n"
            + _event(b"[DONE]", b"\r\n"))
    head = f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {len(body)}\r\n\r\n".encode()
    res = run([head + body])
    assert res.ok and res.done, res.error
    assert res.chunk_tokens == [1] and res.completion_tokens == 3 and res.cached_tokens == 2
    # multi-line data: the two data lines are one JSON document joined by a newline
    assert res.num_events == 3


def test_chat_deltas_with_continuous_usage_count_tokens_per_chunk():
    def delta(text: str, done: int) -> dict:
        return {"choices": [{"index": 0, "delta": {"content": text}}],
                "usage": {"prompt_tokens": 4, "completion_tokens": done}}

    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    body = (_event(role) + _event(delta("ab", 2)) + _event(delta("cde", 5))
            + _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}) + _event(b"[DONE]"))
    res = run([HEAD + _chunked(body)])
    assert res.ok and res.chunk_tokens == [2, 3] and res.finish_reason == "length"
    assert [g == 0.0 for g in res.timing().itl_s()] == [True, False, True, True]  # 5 tokens, 4 gaps


@pytest.mark.parametrize("writes, error", [
    ([b"HTTP/1.1 503 Busy\r\ncontent-length: 20\r\n\r\n" + b'{"error":"busy....."}'[:20]], "HTTP 503"),
    ([HEAD + _chunked(_event(_text("a")))], "stream ended without [DONE]"),
    ([HEAD + _chunked(_event({"error": {"message": "boom"}}), _event(b"[DONE]"))], "in-band error"),
    ([HEAD + _chunked(b"event: error\ndata: {\"message\": \"x\"}\n\n", _event(b"[DONE]"))], "in-band error"),
    ([HEAD + _chunked(_event(b"{not json"), _event(b"[DONE]"))], "bad SSE event"),
    ([HEAD + b"5\r\ndata:"], "connection lost"),
])
def test_failures_are_named(writes, error):
    res = run(writes)
    assert not res.ok and res.error.startswith(error), res.error


def test_connect_failure_and_timeout():
    async def refused() -> StreamResult:
        client = Client("http://127.0.0.1:9")  # discard port: nothing listens
        try:
            return await client.stream("/v1/completions", {}, 2.0)
        finally:
            await client.aclose()

    assert asyncio.run(refused()).error.startswith("connect failed")

    async def slow() -> StreamResult:
        async def handle(reader, writer) -> None:
            await asyncio.sleep(5)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        client = Client(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            return await client.stream("/v1/completions", {}, 0.2)
        finally:
            await client.aclose()
            server.close()

    res = asyncio.run(slow())
    assert res.error == "timeout after 0.2s" and 0.15 < res.end_s - res.sent_s < 2.0
