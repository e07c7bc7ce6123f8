"""A tiny OpenAI-style SSE server in a thread, for client and report tests without a graph.

Streams ``max_tokens`` tokens in chunks of ``chunk_tokens`` (usage on every chunk when the request asks for
``continuous_usage_stats``), reports half of the prompt as cached, and counts requests in /metrics.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field


@dataclass
class FakeServer:
    chunk_tokens: int = 2
    delay_s: float = 0.0
    fail_every: int = 0  # every n-th generate request gets a 503
    port: int = 0
    num_requests: int = 0
    bodies: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        self._started.wait(5)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    async def _shutdown(self) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._tasks: set[asyncio.Task] = set()
        server = self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ")
                headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                await self._route(method, path, body, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    @staticmethod
    def _send(writer, status: int, body: bytes, ctype: str = "application/json") -> None:
        writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
                     + body)

    async def _route(self, method: str, path: str, body: bytes, writer) -> None:
        if path == "/v1/models":
            self._send(writer, 200, json.dumps({"data": [{"id": "fake-model"}, {"id": "other"}]}).encode())
        elif path == "/metrics":
            text = ("# HELP splitserve_frontend_prompt_tokens_total x\n"
                    "# TYPE splitserve_frontend_prompt_tokens_total counter\n"
                    f"splitserve_frontend_prompt_tokens_total {float(self.num_requests * 10)}\n"
                    f'splitserve_frontend_prefill_decisions_total{{where="remote"}} {float(self.num_requests)}\n'
                    'splitserve_frontend_ttft_seconds_bucket{le="0.1"} 3.0\n')
            self._send(writer, 200, text.encode(), "text/plain")
        elif path == "/health":
            self._send(writer, 200, b'{"status":"ok","num_workers":2,"num_decode_workers":1,"num_prefill_workers":1}')
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            await self._generate(json.loads(body), writer, chat=path.endswith("chat/completions"))
        else:
            self._send(writer, 404, b'{"error":{"message":"no"}}')
        await writer.drain()

    async def _generate(self, req: dict, writer, chat: bool) -> None:
        self.num_requests += 1
        self.bodies.append(req)
        if self.fail_every and self.num_requests % self.fail_every == 0:
            self._send(writer, 503, b'{"error":{"message":"busy"}}')
            return
        prompt = len(req["prompt"]) if not chat else sum(len(m["content"].split()) for m in req["messages"])
        n = req["max_tokens"]
        cont = (req.get("stream_options") or {}).get("continuous_usage_stats", False)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")

        def chunk(obj) -> None:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        sent = 0
        while sent < n:
            k = min(self.chunk_tokens, n - sent)
            sent += k
            text = "x" * k
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            obj = {"choices": [choice]}
            if cont:
                obj["usage"] = {"prompt_tokens": prompt, "completion_tokens": sent}
            chunk(obj)
            await writer.drain()
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        chunk({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        chunk({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": n,
                                        "prompt_tokens_details": {"cached_tokens": prompt // 2}}})
        chunk(b"[DONE]")
        writer.write(b"0\r\n\r\n")
