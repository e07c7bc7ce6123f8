"""The one process-graph harness, shared by tests and benchmarks: run `splitserve up` as processes and talk to it.

``start_graph(log_dir, *up_args)`` starts a graph on free ports and returns once the launcher's banner says
every worker registered; ``Graph.stop()`` stops the launcher (which stops its children) and kills what of its
tree is left. Without ``--model`` in ``up_args`` the embedded tiny model is used (``tiny_model_dir``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq.asyncio

from bench.lib.machine import REPO
from bench.lib.procs import children, tree_pids
from cli.launcher import free_port
from common.protocol import GetStats, ListWorkers, WorkerInfo, WorkerList, WorkerStats
from common.tiny_model import make_tiny_model
from common.transport import Client, TransportConfig, new_id

BANNER = "splitserve is serving"  # the launcher prints it once every worker has registered


def tiny_model_dir() -> Path:
    """The embedded tiny model, made once per checkout (deterministic, so sharing it is safe)."""
    path = REPO / "models" / "tiny"
    if not (path / "config.json").exists():
        make_tiny_model(path)
    return path


@dataclass
class Graph:
    proc: subprocess.Popen[bytes]
    url: str  # the frontend, http://127.0.0.1:PORT
    router: str  # the router's ZeroMQ endpoint
    log_path: Path
    cmd: list[str] = field(default_factory=list)
    startup_s: float = 0.0  # launch to banner

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def router_port(self) -> int:
        return int(self.router.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pids(self) -> dict[str, int]:
        """{"frontend": pid, "router": pid, "kvtier": pid, "worker-both-0": pid, ...}: the launcher's children."""
        out: dict[str, int] = {}
        for pid, args in children(self.proc.pid).items():
            try:
                service = args[args.index("cli.main") + 1]
                if service == "worker":
                    service = "worker-" + args[args.index("--worker-id") + 1]
            except (ValueError, IndexError):
                continue
            out[service] = pid
        return out

    def stop(self, timeout_s: float = 40.0) -> list[int]:
        """SIGTERM the launcher (it stops its children); SIGKILL what of its tree is left; returns those pids."""
        tree = tree_pids(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        left = [p for p in tree if p != self.proc.pid]
        deadline = time.monotonic() + 2.0  # children the launcher signalled may still be exiting
        while (left := [p for p in left if Path(f"/proc/{p}").exists()]) and time.monotonic() < deadline:
            time.sleep(0.05)
        for p in left:  # only processes this graph started
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left

    async def workers(self) -> WorkerList:
        return await list_workers(self.router)


def start_graph(log_dir: Path, *args: str, ready_timeout_s: float = 240.0, log_name: str = "") -> Graph:
    """`splitserve up *args` on free ports; returns once every worker registered. Interrupted (timeout, Ctrl-C,
    the graph exiting), it stops what it started and raises."""
    port, router_port = free_port(), free_port()
    log_path = Path(log_dir) / (log_name or f"graph-{port}.log")
    model = [] if "--model" in args else ["--model", str(tiny_model_dir())]
    cmd = [sys.executable, "-m", "cli.main", "up", *model, "--port", str(port), "--router-port", str(router_port),
           *args]
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log,
                                stderr=subprocess.STDOUT)
    graph = Graph(proc, f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{router_port}", log_path, cmd)
    try:
        while time.monotonic() - t0 < ready_timeout_s:
            if proc.poll() is not None:
                raise RuntimeError(f"graph exited ({proc.returncode}):\n{graph.logs()[-5000:]}")
            if BANNER in graph.logs():
                graph.startup_s = time.monotonic() - t0
                return graph
            time.sleep(0.2)
        raise RuntimeError(f"graph not healthy in {ready_timeout_s}s:\n{graph.logs()[-5000:]}")
    except BaseException:
        graph.stop()
        raise


async def ask(endpoint: str, message: Any, timeout_s: float = 5.0, transport: TransportConfig = TransportConfig()) -> Any:
    """One request to a service's ZeroMQ endpoint (router, worker, kvtier) and its reply (``transport``: CURVE keys
    set ``toward`` that server, for a graph started with ``--curve-dir``)."""
    ctx = zmq.asyncio.Context()
    client = Client(ctx, endpoint, transport)
    try:
        return await client.request(message, timeout_s)
    finally:
        await client.close()
        ctx.destroy(linger=0)


async def list_workers(router: str, transport: TransportConfig = TransportConfig()) -> WorkerList:
    reply = await ask(router, ListWorkers(request_id=new_id("g")), transport=transport)
    assert isinstance(reply, WorkerList)
    return reply


async def worker_infos(router: str) -> dict[str, tuple[WorkerInfo, WorkerStats]]:
    """Every registered worker's registration and WorkerStats."""
    out = {}
    for info in (await list_workers(router)).workers:
        stats = await ask(info.endpoint, GetStats(request_id=new_id("g")))
        assert isinstance(stats, WorkerStats)
        out[info.worker_id] = (info, stats)
    return out


def worker_ids(router: str) -> set[str]:
    """The workers the router lists, without asking each of them (a dying one may not answer)."""
    return {info.worker_id for info in asyncio.run(list_workers(router)).workers}


def worker_stats(router: str) -> dict[str, WorkerStats]:
    return {wid: stats for wid, (_, stats) in asyncio.run(worker_infos(router)).items()}


def wait_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def child_pid(graph: Graph, needle: str) -> int:
    """PID of the graph's child process whose command line contains ``needle`` (e.g. "--worker-id both-0")."""
    for pid, args in children(graph.proc.pid).items():
        if needle in " ".join(args):
            return pid
    raise LookupError(f"no child of {graph.proc.pid} matches {needle!r}")
