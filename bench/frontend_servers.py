"""Which HTTP server for the frontend: ours (services/frontend/http.py) side by side with uvicorn and granian.

One mock graph (``up --engine mock --mock-speedup inf --aggregated 2 --no-kvtier``: router, 2 zero-delay mock
workers) and next to it one extra frontend process per server, all on the same router and the same
FrontendService (routes, tokenizer, pipeline): only the HTTP layer differs.

  ours:     ``splitserve frontend`` (asyncio + httptools, uvloop)
  uvicorn:  uvicorn (http=httptools, loop=uvloop), a plain ASGI app over FrontendService.handle, no framework
  granian:  granian --interface asgi (Rust HTTP, 1 worker, uvloop), the same ASGI app

Streaming chat completions (max_tokens 16, ignore_eos) at concurrency 64, short prompts and ~2,000-token
prompts, servers interleaved A B C A B C; per run: request rate, TTFT/e2e percentiles and the server's CPU per
request (utime+stime of its process tree). Writes bench/results/frontend_servers.json.

    python -m bench.frontend_servers [--requests 2000] [--granian-path DIR]

The ASGI adapter does not watch for client disconnects (the benchmark's clients never hang up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
from cli.ports import free_port

RESULTS = REPO / "bench" / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")
_WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches near an old "
          "river bank where people gather every morning to discuss weather politics music science history").split()


# ------------------------------------------------------------------------------------------- the ASGI app

class _AsgiResponse:
    """FrontendService's response interface over ASGI ``send``: sync calls queue, the next await flushes."""

    def __init__(self, send) -> None:
        self._send = send
        self._pending: list[dict] = []
        self.started = self.done = self.disconnected = False
        self.status = 0

    def send(self, status: int, body: bytes, content_type: bytes = b"application/json", headers=()) -> None:
        self._pending += [{"type": "http.response.start", "status": status, "headers": [
            (b"content-type", content_type), (b"content-length", b"%d" % len(body)), *headers]},
            {"type": "http.response.body", "body": body}]
        self.started = self.done = True
        self.status = status

    def start(self, status: int, content_type: bytes, headers=()) -> None:
        self._pending.append({"type": "http.response.start", "status": status,
                              "headers": [(b"content-type", content_type), (b"cache-control", b"no-cache"), *headers]})
        self.started = True
        self.status = status

    async def write(self, chunk: bytes) -> None:
        if chunk:
            self._pending.append({"type": "http.response.body", "body": chunk, "more_body": True})
            await self.flush()

    def end(self, last_chunk: bytes = b"") -> None:
        self._pending.append({"type": "http.response.body", "body": last_chunk})
        self.done = True

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        for message in pending:
            await self._send(message)


_service = None


async def asgi_app(scope, receive, send) -> None:
    global _service
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _service = _make_service()
                loop = asyncio.get_running_loop()
                _service._bench_tasks = [loop.create_task(_service.pipeline.watch_workers())]
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    from services.frontend.http import Request

    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    req = Request(scope["method"], scope["path"], scope["query_string"].decode("latin-1"), headers, body, True)
    resp = _AsgiResponse(send)
    try:
        await _service.handle(req, resp)
    except Exception as exc:
        if not resp.done:
            _service._on_handler_error(resp, exc)
    await resp.flush()


def _make_service():
    from services.frontend.pipeline import PipelineConfig
    from services.frontend.service import FrontendConfig, FrontendService

    # The benchmark's own child processes get their settings this way (granian imports the app by name).
    model = Path(os.environ["BENCH_MODEL"])
    return FrontendService(FrontendConfig(model_name=model.resolve().name, model_dir=model,
                                          pipeline=PipelineConfig(router_endpoint=os.environ["BENCH_ROUTER"])))


def serve_uvicorn(port: int) -> None:
    import uvicorn

    from cli.logs import configure_logging

    configure_logging("warning")
    uvicorn.run(asgi_app, host="127.0.0.1", port=port, http="httptools", loop="uvloop", lifespan="on",
                log_level="warning", access_log=False)


# ------------------------------------------------------------------------------------------- load client

class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport = None
        self.buf = bytearray()
        self.fut: asyncio.Future | None = None
        self.first_s = 0.0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.first_s:
            self.first_s = time.perf_counter()
        self.buf += data
        if self.fut is None or self.fut.done():
            return
        if self.buf.endswith(b"0\r\n\r\n"):  # a stream's last chunk
            self.fut.set_result(bytes(self.buf))
        elif not self.buf.startswith(b"HTTP/1.1 200") and b"\r\n\r\n" in self.buf:  # an error, whole
            head, _, body = bytes(self.buf).partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            if len(body) >= length:
                self.fut.set_result(bytes(self.buf))

    def connection_lost(self, exc) -> None:
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(ConnectionError("closed"))


async def _run_load(port: int, requests: list[bytes], concurrency: int) -> dict:
    loop = asyncio.get_running_loop()
    ttft, e2e, errors = [], [], 0
    it = iter(requests)

    async def slot() -> None:
        nonlocal errors
        conn = None
        for req in it:
            if conn is None or conn.transport.is_closing():
                _, conn = await loop.create_connection(_Conn, "127.0.0.1", port)
            conn.buf.clear()
            conn.first_s = 0.0
            conn.fut = loop.create_future()
            t0 = time.perf_counter()
            conn.transport.write(req)
            try:
                body = await asyncio.wait_for(conn.fut, 60)
            except (ConnectionError, TimeoutError):
                errors += 1
                conn.transport.close()
                continue
            if not body.startswith(b"HTTP/1.1 200") or b"[DONE]" not in body:
                errors += 1
                continue
            ttft.append(conn.first_s - t0)
            e2e.append(time.perf_counter() - t0)
        if conn is not None:
            conn.transport.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(slot() for _ in range(concurrency)))
    wall_s = time.perf_counter() - t0

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 2)

    return {"requests_per_s": round(len(requests) / wall_s, 1), "wall_s": round(wall_s, 3), "errors": errors,
            "ttft_ms": {"p50": pct(ttft, 0.5), "p99": pct(ttft, 0.99)},
            "e2e_ms": {"p50": pct(e2e, 0.5), "p99": pct(e2e, 0.99)}}


def chat_bytes(port: int, model: str, text: str, max_tokens: int) -> bytes:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                       "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


# ------------------------------------------------------------------------------------------- processes

def tree_cpu_s(pid: int) -> float:
    """utime+stime of a process and its descendants (granian runs its app in a worker process)."""
    total = 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        fields = stat[stat.rfind(b")") + 2:].split()
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += tree_cpu_s(int(child))
    except OSError:
        pass
    return total


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_ready(port: int, proc: subprocess.Popen, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not come up (exit {proc.poll()})")
        time.sleep(0.2)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_servers(model: Path, router: str, granian_path: str, log) -> dict[str, tuple[int, subprocess.Popen]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BENCH_MODEL": str(model), "BENCH_ROUTER": router,
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), granian_path) if p)}
    ports = {name: free_port() for name in ("ours", "uvicorn", "granian")}
    cmds = {
        "ours": [sys.executable, "-m", "cli.main", "frontend", "--model", str(model), "--router", router,
                 "--port", str(ports["ours"]), "--log-level", "warning"],
        "uvicorn": [sys.executable, str(Path(__file__)), "--serve-uvicorn", str(ports["uvicorn"])],
        "granian": [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port",
                    str(ports["granian"]), "--workers", "1", "--loop", "uvloop", "--http", "1", "--no-ws",
                    "--log-level", "warning", "--no-access-log", "bench.frontend_servers:asgi_app"],
    }
    out = {}
    for name, cmd in cmds.items():
        out[name] = (ports[name], subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    for name, (port, proc) in out.items():
        wait_ready(port, proc, name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--long-tokens", type=int, default=2000, help="prompt tokens of the long workload")
    ap.add_argument("--rounds", type=int, default=2, help="A B C repeated this many times")
    ap.add_argument("--model", type=Path, default=REPO / "models" / "tiny")
    ap.add_argument("--granian-path", default="", help="extra sys.path where granian is installed")
    ap.add_argument("--out", type=Path, default=RESULTS / "frontend_servers.json")
    ap.add_argument("--serve-uvicorn", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_uvicorn:
        serve_uvicorn(args.serve_uvicorn)
        return

    import uvloop

    from common.tiny_model import make_tiny_model
    from services.frontend.tokenizer import ModelTokenizer

    if not (args.model / "config.json").exists():
        make_tiny_model(args.model)
    model_name = args.model.resolve().name
    RESULTS.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = [rng.choice(_WORDS) for _ in range(args.long_tokens * 2)]
    tok = ModelTokenizer(args.model)

    def isl(num_words: int) -> int:
        text = "Request 0: " + " ".join(words[:num_words])
        return len(tok.apply_chat_template([{"role": "user", "content": text}]).token_ids)

    lo, hi = 1, len(words)
    while lo < hi:  # fewest words reaching the target
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if isl(mid) < args.long_tokens else (lo, mid)
    long_base, long_isl = " ".join(words[:lo]), isl(lo)
    texts = {"short": lambda i: f"Request {i}: tell me a short story about a fox.",
             "long": lambda i: f"Request {i}: {long_base}"}

    log = open(RESULTS / "frontend_servers.log", "wb")
    graph_port, router_port = free_port(), free_port()
    graph = subprocess.Popen([sys.executable, "-m", "cli.main", "up", "--engine", "mock", "--mock-speedup", "inf",
                              "--aggregated", "2", "--no-kvtier", "--port", str(graph_port),
                              "--router-port", str(router_port),
                              "--model", str(args.model), "--log-level", "warning"],
                             cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    servers: dict[str, tuple[int, subprocess.Popen]] = {}
    runs: list[dict] = []
    try:
        wait_ready(graph_port, graph, "graph")
        time.sleep(2.0)  # every worker registered
        servers = start_servers(args.model, f"tcp://127.0.0.1:{router_port}", args.granian_path, log)
        counter = 0
        for workload in ("short", "long"):
            for rnd in range(args.rounds):
                for name, (port, proc) in servers.items():
                    text = texts[workload]
                    warm = [chat_bytes(port, model_name, text(counter + i), args.max_tokens) for i in range(args.warmup)]
                    counter += args.warmup
                    reqs = [chat_bytes(port, model_name, text(counter + i), args.max_tokens) for i in range(args.requests)]
                    counter += args.requests
                    uvloop.run(_run_load(port, warm, args.concurrency))
                    cpu0 = tree_cpu_s(proc.pid)
                    res = uvloop.run(_run_load(port, reqs, args.concurrency))
                    res["server_cpu_ms_per_request"] = round((tree_cpu_s(proc.pid) - cpu0) * 1e3 / args.requests, 3)
                    res.update(server=name, workload=workload, round=rnd)
                    runs.append(res)
                    print(json.dumps(res), flush=True)
    finally:
        for _, proc in servers.values():
            stop(proc)
        stop(graph)

    summary: dict[str, dict] = {}
    for r in runs:
        s = summary.setdefault(f"{r['workload']}/{r['server']}", {"requests_per_s": [], "cpu_ms": [],
                                                                   "ttft_p50_ms": [], "e2e_p99_ms": []})
        s["requests_per_s"].append(r["requests_per_s"])
        s["cpu_ms"].append(r["server_cpu_ms_per_request"])
        s["ttft_p50_ms"].append(r["ttft_ms"]["p50"])
        s["e2e_p99_ms"].append(r["e2e_ms"]["p99"])
    import importlib.metadata as md

    versions = {}
    for pkg in ("uvicorn", "httptools", "uvloop", "granian"):
        found = [d.version for d in md.distributions(name=pkg, path=[args.granian_path, *sys.path])]
        versions[pkg] = found[0] if found else None
    conditions = {
        "graph": "up --engine mock --mock-speedup inf --aggregated 2 --no-kvtier (router, 2 zero-delay mock workers)",
        "servers": "one extra frontend process each, same router, same FrontendService; ours = splitserve "
                   "frontend; uvicorn http=httptools loop=uvloop; granian --interface asgi --workers 1 --loop uvloop",
        "request": "POST /v1/chat/completions stream=true include_usage ignore_eos", "osl": args.max_tokens,
        "concurrency": args.concurrency, "num_requests": args.requests, "warmup_requests": args.warmup,
        "long_prompt_tokens": long_isl, "order": "short then long; servers interleaved A B C, rounds=" + str(args.rounds),
        "client": "this process, raw asyncio keep-alive, uvloop", "versions": versions,
        "machine": {"nproc": os.cpu_count(), "loadavg_before": os.getloadavg()},
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    args.out.write_text(json.dumps({"bench": "frontend_servers", "conditions": conditions, "summary": summary,
                                    "runs": runs}, indent=2) + "\n")
    for key, s in summary.items():
        print(f"{key:16s} req/s {s['requests_per_s']}  server CPU ms/req {s['cpu_ms']}  "
              f"TTFT p50 ms {s['ttft_p50_ms']}  e2e p99 ms {s['e2e_p99_ms']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
