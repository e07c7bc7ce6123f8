"""A splitserve graph spread over namespaced hosts: each service started by its own command on its own host.

Every service binds its host's bridge address and advertises it (nothing assumes loopback); the test process,
in the root namespace, reaches them through its own veth on the bridge.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import openai
import zmq.asyncio

from tests.harness.graph import REPO, worker_stats
from tests.harness.hosts import Host, HostProc, Hosts
from common.protocol import GetStats, ListWorkers, TierStats, WorkerList, WorkerStats
from common.transport import Client, new_id

ROUTER_PORT, EVENTS_PORT, FRONTEND_PORT, WORKER_PORT, KVTIER_PORT = 5550, 5551, 8000, 5560, 5570


def node_name(host: Host) -> str:
    """The machine name a host's services register (host-a, host-b, ...)."""
    return f"host-{chr(ord('a') + host.index)}"


@dataclass
class Service:
    name: str
    host: Host
    proc: HostProc


@dataclass
class Cluster:
    hosts: Hosts
    tmp: Path
    model: Path
    router_host: Host | None = None
    frontend_host: Host | None = None
    services: list[Service] = field(default_factory=list)
    stopped: list[Service] = field(default_factory=list)

    @property
    def router_endpoint(self) -> str:
        assert self.router_host is not None
        return f"tcp://{self.router_host.address}:{ROUTER_PORT}"

    @property
    def url(self) -> str:
        assert self.frontend_host is not None
        return f"http://{self.frontend_host.address}:{FRONTEND_PORT}"

    def _start(self, name: str, host: Host, args: list[str], core: int | None = None,
               env: dict[str, str] | None = None) -> Service:
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
        proc = host.spawn([sys.executable, "-m", "cli.main", *args], env=env, log_path=self.tmp / f"{name}.log",
                          core=core, cwd=str(REPO))
        service = Service(name, host, proc)
        self.services.append(service)
        return service

    def router(self, host: Host, *extra: str) -> Service:
        self.router_host = host
        events = f"tcp://{host.address}:{EVENTS_PORT}"
        return self._start("router", host, ["router", "--endpoint", self.router_endpoint, "--events-endpoint",
                                            events, "--events-advertise", events, *extra])

    def frontend(self, host: Host, *extra: str) -> Service:
        self.frontend_host = host
        return self._start("frontend", host, ["frontend", "--model", str(self.model), "--router",
                                              self.router_endpoint, "--host", host.address, "--port",
                                              str(FRONTEND_PORT), *extra])

    def worker(self, host: Host, role: str, worker_id: str, *extra: str, port: int = WORKER_PORT,
               core: int | None = None, env: dict[str, str] | None = None) -> Service:
        endpoint = f"tcp://{host.address}:{port}"
        return self._start(worker_id, host, ["worker", "--model", str(self.model), "--role", role, "--worker-id",
                                             worker_id, "--node", node_name(host), "--router", self.router_endpoint,
                                             "--endpoint", endpoint, "--advertise", endpoint, *extra],
                           core=core, env=env)

    def kvtier(self, host: Host, tier_id: str, *extra: str) -> Service:
        endpoint = f"tcp://{host.address}:{KVTIER_PORT}"
        return self._start(tier_id, host, ["kvtier", "--endpoint", endpoint, "--advertise", endpoint, "--router",
                                           self.router_endpoint, "--tier-id", tier_id, "--node", node_name(host),
                                           *extra])

    @staticmethod
    def kvtier_endpoint(host: Host) -> str:
        return f"tcp://{host.address}:{KVTIER_PORT}"

    def health(self) -> dict:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())
        except OSError:
            return {}

    def wait_ready(self, num_prefill: int, num_decode: int, timeout_s: float = 60.0) -> float:
        """Poll the frontend's /health until the workers registered; seconds it took."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if dead := [s.name for s in self.services if s.proc.poll() is not None]:
                raise RuntimeError(f"exited before ready: {dead}\n{self.logs()}")
            h = self.health()
            if h.get("num_prefill_workers") == num_prefill and h.get("num_decode_workers") == num_decode:
                return time.monotonic() - t0
            time.sleep(0.2)
        raise RuntimeError(f"not ready in {timeout_s}s: {self.health()}\n{self.logs()}")

    def client(self, timeout_s: float = 60.0) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=timeout_s)

    def service(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    def stop_service(self, name: str, timeout_s: float = 30.0) -> None:
        """Stop one service (SIGTERM: it drains and deregisters); its log stays in ``logs()``."""
        service = self.service(name)
        service.proc.stop(timeout_s)
        self.services.remove(service)
        self.stopped.append(service)

    def kill_service(self, name: str) -> None:
        """SIGKILL one service (no drain, no deregistration: a crash or an OOM kill); vLLM's engine processes
        below a worker die with it (they watch their parent)."""
        service = self.service(name)
        service.proc.signal(signal.SIGKILL)
        service.proc.wait(30)
        self.services.remove(service)
        self.stopped.append(service)

    def workers(self) -> WorkerList:
        """The router's list of registered workers."""
        return asyncio.run(_list_workers(self.router_endpoint))

    def stats(self) -> dict[str, WorkerStats]:
        return worker_stats(self.router_endpoint)

    def tier_stats(self, host: Host) -> TierStats:
        """The stats of the kvtier on ``host``, asked over the bridge."""
        return asyncio.run(_tier_stats(self.kvtier_endpoint(host)))

    def logs(self, tail_chars: int = 3000) -> str:
        return "\n".join(f"--- {s.name} on {s.host.name}:\n{s.proc.logs()[-tail_chars:]}"
                         for s in self.stopped + self.services)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every service at once, SIGKILL what is left after ``timeout_s``."""
        for service in self.services:
            service.proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for service in self.services:
            service.proc.stop(timeout_s=max(0.1, deadline - time.monotonic()))


async def _list_workers(router: str) -> WorkerList:
    ctx = zmq.asyncio.Context()
    client = Client(ctx, router)
    try:
        reply = await client.request(ListWorkers(request_id=new_id("t")), 5.0)
        assert isinstance(reply, WorkerList)
        return reply
    finally:
        await client.close()
        ctx.destroy(linger=0)


async def _tier_stats(endpoint: str) -> TierStats:
    ctx = zmq.asyncio.Context()
    client = Client(ctx, endpoint)
    try:
        reply = await client.request(GetStats(request_id=new_id("t")), 5.0)
        assert isinstance(reply, TierStats)
        return reply
    finally:
        await client.close()
        ctx.destroy(linger=0)
