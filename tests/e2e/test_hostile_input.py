"""Hostile input on every door: fuzzed HTTP bodies and malformed ZeroMQ frames. Nothing crashes, bad input gets
a 4xx (or a log line on sockets), and the next good request is served."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness.graph import Graph, worker_stats
from common.protocol import ListWorkers, WorkerList
from common.transport import Client, new_id
from tests.e2e.test_openai_api import MODEL, client

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
_fields = st.fixed_dictionaries({}, optional={
    "model": st.one_of(st.just(MODEL), st.text(max_size=8), _json),
    "messages": st.one_of(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "x"]),
                                                          "content": st.one_of(st.text(max_size=30), _json)}),
                                   max_size=3), _json),
    "prompt": st.one_of(st.text(max_size=30), st.lists(st.integers(-5, 9000), max_size=6), _json),
    "max_tokens": st.one_of(st.integers(-3, 5), _json),
    "temperature": st.one_of(st.floats(-1, 3, allow_nan=False), _json),
    "top_p": st.one_of(st.floats(-1, 2, allow_nan=False), _json),
    "n": st.one_of(st.integers(0, 3), _json),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=20), _json),
    "stream": st.one_of(st.booleans(), _json),
    "seed": st.one_of(st.integers(-2**40, 2**40), _json),
})


def test_fuzzed_requests_get_200_or_a_clean_4xx(mock_pd: Graph) -> None:
    http = httpx.Client(base_url=mock_pd.url, timeout=30)
    statuses: dict[int, int] = {}

    @settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
           body=st.one_of(_fields.map(lambda d: json.dumps(d).encode()), st.binary(max_size=64)))
    def one(path: str, body: bytes) -> None:
        resp = http.post(path, content=body, headers={"content-type": "application/json"})
        statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
        assert resp.status_code in (200, 400, 404, 413), resp.text
        if resp.status_code != 200:
            error = resp.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}

    one()
    http.close()
    assert sum(statuses.values()) == 2000
    assert client(mock_pd).completions.create(model=MODEL, prompt="still here", max_tokens=2).usage.completion_tokens == 2


def test_garbage_on_the_http_socket(mock_pd: Graph) -> None:
    host, port = mock_pd.url.removeprefix("http://").split(":")
    for junk in [b"\x00\xff" * 100, b"GET / HTTP/9.9\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n"]:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            reply = s.recv(4096)  # a 4xx or a closed connection, never a hang (the timeout raises)
            status_line = reply.split(b"\r\n", 1)[0]
            assert reply == b"" or status_line.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")), (junk[:40], reply[:200])
    assert client(mock_pd).completions.create(model=MODEL, prompt="ok", max_tokens=1).usage.completion_tokens == 1


async def _send_junk(endpoints: list[str], router: str) -> WorkerList:
    ctx = zmq.asyncio.Context()
    # The last one is over the 16 MiB message cap: dropped, and the connection it came on keeps serving.
    junk = [b"", b"\x00", b"\x93\x01\x02\x03", b"\xc1" * 64, b'\x81\xa4type\xa8Generate', b"x" * 100_000,
            b"\x00" * (17 * 1024 * 1024)]
    try:
        for endpoint in endpoints:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            for frame in junk:
                await sock.send(frame)
            await sock.send_multipart([b"a", b"b", b"c"])
            sock.close()
        await asyncio.sleep(0.3)
        c = Client(ctx, router)
        reply = await c.request(ListWorkers(request_id=new_id("t")), 5.0)
        await c.close()
        assert isinstance(reply, WorkerList)
        return reply
    finally:
        ctx.term()


def test_malformed_frames_to_every_zmq_socket(mock_pd: Graph) -> None:
    workers = asyncio.run(_send_junk([mock_pd.router], mock_pd.router))
    endpoints = [w.endpoint for w in workers.workers]
    assert len(endpoints) == 2
    after = asyncio.run(_send_junk(endpoints, mock_pd.router))
    assert len(after.workers) == 2
    assert len(worker_stats(mock_pd.router)) == 2
    assert client(mock_pd).completions.create(model=MODEL, prompt=list(range(10, 400)),
                                              max_tokens=3).usage.completion_tokens == 3
