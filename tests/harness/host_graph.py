"""A P/D graph spread over namespaced hosts (tests/harness/hosts.py): router and frontend on one host, a prefill and
a decode worker each on a host of its own (or both on one), every socket bound to its host's bridge address.

Ports are fixed: each host has its own network namespace, so only services sharing a host need distinct ones.
The caller reaches the frontend and the router through the root namespace's veth on the bridge.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.harness.hosts import Host, HostProc

REPO = Path(__file__).resolve().parents[2]
ROUTER_PORT, FRONTEND_PORT = 7000, 8000
WORKER_PORT, NIXL_PORT = 7100, 7200  # + the worker's index: a prefill and a decode worker may share a host


@dataclass(frozen=True)
class Placement:
    control: Host  # router and frontend
    prefill: Host
    decode: Host
    engine: str = "vllm"
    dtype: str = "float32"
    block_size: int = 32
    kv_cache_gib: int = 1
    control_core: int = 0  # the prefill engine's core: decode latency keeps its core to itself (cli/launcher.py)
    prefill_core: int = 0
    decode_core: int = 1

    @property
    def same_host(self) -> bool:
        return self.prefill.name == self.decode.name


class HostGraph:
    """Start, wait for every worker, stop. ``env`` goes to every process (e.g. UCX_LOG_LEVEL)."""

    def __init__(self, placement: Placement, model: Path, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.p = placement
        self.model = model
        self.log_dir = log_dir
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO),
                    **(env or {})}
        self.router = f"tcp://{placement.control.address}:{ROUTER_PORT}"
        self.frontend = (placement.control.address, FRONTEND_PORT)
        self.procs: dict[str, HostProc] = {}

    def log_path(self, name: str) -> Path:
        tag = "same" if self.p.same_host else "cross"
        return self.log_dir / f"multihost-{tag}-{name}.log"

    def _worker(self, role: str, index: int, host: Host, core: int) -> list[str]:
        return ["worker", "--model", str(self.model), "--role", role, "--router", self.router,
                "--engine", self.p.engine, "--dtype", self.p.dtype, "--block-size", str(self.p.block_size),
                "--worker-id", f"{role}-{host.name}", "--node", host.name,
                "--endpoint", f"tcp://{host.address}:{WORKER_PORT + index}",
                "--nixl-host", host.address, "--nixl-port", str(NIXL_PORT + index),
                "--kv-cache-gib", str(self.p.kv_cache_gib), "--core", str(core)]

    def commands(self) -> dict[str, tuple[Host, list[str], int | None]]:
        """name -> (host, `python -m cli.main` arguments, core to pin to; None: the worker pins itself)."""
        p = self.p
        return {
            "router": (p.control, ["router", "--endpoint", self.router], p.control_core),
            "prefill": (p.prefill, self._worker("prefill", 0, p.prefill, p.prefill_core), None),
            "decode": (p.decode, self._worker("decode", 1, p.decode, p.decode_core), None),
            "frontend": (p.control, ["frontend", "--model", str(self.model), "--router", self.router,
                                     "--host", p.control.address, "--port", str(FRONTEND_PORT)], p.control_core),
        }

    def command_lines(self) -> dict[str, str]:
        return {name: f"[{host.name}] python -m cli.main " + " ".join(args)
                for name, (host, args, _) in self.commands().items()}

    def start(self, timeout_s: float = 300.0) -> float:
        """Seconds until the frontend answers and both workers are registered."""
        t0 = time.monotonic()
        for name, (host, args, core) in self.commands().items():
            path = self.log_path(name)
            path.unlink(missing_ok=True)
            self.procs[name] = host.spawn([sys.executable, "-m", "cli.main", *args], self.env, path, core=core,
                                          cwd=str(REPO))
        while not self._ready():
            dead = [n for n, pr in self.procs.items() if pr.poll() is not None]
            if dead or time.monotonic() - t0 > timeout_s:
                self.stop()
                raise RuntimeError(f"graph did not come up ({'exited: ' + ', '.join(dead) if dead else 'timeout'}); "
                                   f"see {self.log_dir}/multihost-*.log")
            time.sleep(0.5)
        return time.monotonic() - t0

    def _ready(self) -> bool:
        host, port = self.frontend
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2) as resp:
                if resp.status != 200:
                    return False
        except OSError:
            return False
        return len(asyncio.run(self.workers())) >= 2

    async def workers(self) -> list:
        import zmq.asyncio

        from common.errors import SplitserveError
        from common.protocol import ListWorkers, WorkerList
        from common.transport import Client, new_id

        ctx = zmq.asyncio.Context()
        client = Client(ctx, self.router)
        try:
            reply = await client.request(ListWorkers(request_id=new_id("bench")), 5.0)
            assert isinstance(reply, WorkerList)
            return list(reply.workers)
        except SplitserveError:  # not up yet
            return []
        finally:
            await client.close()
            ctx.destroy(linger=0)

    def stop(self) -> None:
        """Frontend first, then workers (they drain), then the router; SIGKILL after 20 s each."""
        for name in ("frontend", "decode", "prefill", "router"):
            if name in self.procs:
                self.procs.pop(name).stop(20.0)
