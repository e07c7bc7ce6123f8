"""Test harness: run a real splitserve graph (`splitserve up`) as processes and talk to its parts."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio

from cli.launcher import free_port
from common.protocol import GetStats, ListWorkers, WorkerList, WorkerStats
from common.tiny_model import make_tiny_model
from common.transport import Client, new_id

REPO = Path(__file__).resolve().parents[1]


def tiny_model_dir() -> Path:
    """The embedded tiny model, made once per checkout (deterministic, so sharing it is safe)."""
    path = REPO / "models" / "tiny"
    if not (path / "config.json").exists():
        make_tiny_model(path)
    return path


@dataclass
class Graph:
    proc: subprocess.Popen[bytes]
    url: str
    router: str
    log_path: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_graph(tmp: Path, *args: str, ready_timeout_s: float = 240.0) -> Graph:
    port, router_port = free_port(), free_port()
    log_path = tmp / f"graph-{port}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "cli.main", "up", "--model", str(tiny_model_dir()), "--port", str(port),
           "--router-port", str(router_port), *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    graph = Graph(proc, f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{router_port}", log_path)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"graph exited ({proc.returncode}):\n{graph.logs()[-5000:]}")
        # The launcher prints its banner once every worker has registered.
        if "splitserve is serving" in graph.logs():
            return graph
        time.sleep(0.2)
    graph.stop()
    raise RuntimeError(f"graph not healthy in {ready_timeout_s}s:\n{graph.logs()[-5000:]}")


async def _worker_stats(router: str) -> dict[str, WorkerStats]:
    ctx = zmq.asyncio.Context()
    clients = [Client(ctx, router)]
    try:
        workers = await clients[0].request(ListWorkers(request_id=new_id("t")), 5.0)
        assert isinstance(workers, WorkerList)
        out = {}
        for info in workers.workers:
            client = Client(ctx, info.endpoint)
            clients.append(client)
            stats = await client.request(GetStats(request_id=new_id("t")), 5.0)
            assert isinstance(stats, WorkerStats)
            out[info.worker_id] = stats
        return out
    finally:
        for c in clients:
            await c.close()
        ctx.term()


def worker_stats(router: str) -> dict[str, WorkerStats]:
    return asyncio.run(_worker_stats(router))


def wait_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def child_pid(graph: Graph, needle: str) -> int:
    """PID of the graph's child process whose command line contains ``needle`` (e.g. "--worker-id both-0")."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == graph.proc.pid and needle in cmdline:
            return int(entry.name)
    raise LookupError(f"no child of {graph.proc.pid} matches {needle!r}")
