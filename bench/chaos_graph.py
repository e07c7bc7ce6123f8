"""The graph bench/chaos.py breaks: services on namespaced hosts (tests/harness/hosts.py), each restartable.

Mock topology: host A frontend x2 and router x2, B prefill + kvtier, C prefill + decode + kvtier, D decode.
vLLM topology (2 cores cannot hold four engines): A the same, B prefill, D decode, no kvtier.
A service keeps its command, host and core: ``restart`` starts the same command again, as `up` restarts a crashed
child (cli/children.py); ``supervise`` does so for a service that exits by itself, and writes each exit down.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.hosts import Host, HostProc, Hosts

REPO = Path(__file__).resolve().parents[1]
ROUTER_PORTS, EVENT_PORTS, FRONTEND_PORTS = (5550, 5552), (5551, 5553), (8000, 8001)
WORKER_PORT, NIXL_PORT, KVTIER_PORT = 5560, 5600, 5570


@dataclass
class Svc:
    name: str
    kind: str  # frontend | router | worker | kvtier
    host: Host
    args: list[str]
    core: int
    proc: HostProc | None = None
    num_restarts: int = 0
    endpoint: str = ""  # router/worker/kvtier ZeroMQ endpoint; frontend: its http://host:port


@dataclass
class ChaosGraph:
    hosts: Hosts
    log_dir: Path
    model: Path
    engine: str = "mock"
    mock_speedup: float = 4.0
    num_blocks: int = 1024
    heartbeat_timeout_s: float = 5.0
    services: dict[str, Svc] = field(default_factory=dict)
    # Held while a service is killed and started again, so that ``supervise`` never takes a fault for an exit.
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Services that exited by themselves: {"at_s", "service", "returncode"}.
    self_exits: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        a, b, c, d = self.hosts[0], self.hosts[1], self.hosts[2], self.hosts[3]
        routers = [f"tcp://{a.address}:{p}" for p in ROUTER_PORTS]
        self.router_list = ",".join(routers)
        for i, (ep, ev) in enumerate(zip(routers, EVENT_PORTS, strict=True)):
            events = f"tcp://{a.address}:{ev}"
            self._add(f"router-{i}", "router", a, 0, ep,
                      ["router", "--endpoint", ep, "--events-endpoint", events, "--events-advertise", events,
                       "--heartbeat-timeout-s", str(self.heartbeat_timeout_s)])
        for i, port in enumerate(FRONTEND_PORTS):
            self._add(f"frontend-{i}", "frontend", a, 0, f"http://{a.address}:{port}",
                      ["frontend", "--model", str(self.model), "--router", self.router_list, "--host", a.address,
                       "--port", str(port)])
        if self.engine == "mock":
            for host, core in ((b, 0), (c, 1)):
                ep = f"tcp://{host.address}:{KVTIER_PORT}"
                self._add(f"kvtier-{_tag(host)}", "kvtier", host, core, ep,
                          ["kvtier", "--endpoint", ep, "--advertise", ep, "--router", self.router_list,
                           "--tier-id", f"kvtier-{_tag(host)}", "--node", _node(host), "--no-nixl",
                           "--host-cache-gb", "0.25"])
            placed = [("prefill", b, 0, 0), ("prefill", c, 1, 0), ("decode", c, 1, 1), ("decode", d, 1, 0)]
        else:
            placed = [("prefill", b, 0, 0), ("decode", d, 1, 0)]
        for role, host, core, slot in placed:
            self._worker(role, host, core, slot)

    def _add(self, name: str, kind: str, host: Host, core: int, endpoint: str, args: list[str]) -> None:
        self.services[name] = Svc(name, kind, host, args, core, endpoint=endpoint)

    def _worker(self, role: str, host: Host, core: int, slot: int) -> None:
        ep = f"tcp://{host.address}:{WORKER_PORT + slot}"
        args = ["worker", "--model", str(self.model), "--role", role, "--worker-id", f"{role}-{_tag(host)}",
                "--node", _node(host), "--router", self.router_list, "--endpoint", ep, "--advertise", ep,
                "--engine", self.engine, "--num-blocks", str(self.num_blocks)]
        if self.engine == "mock":
            args += ["--mock-speedup", str(self.mock_speedup)]
            if _tag(host) in "bc":  # the hosts with a kvtier
                args += ["--kvtier", f"tcp://{host.address}:{KVTIER_PORT}"]
        else:
            args += ["--dtype", "float32", "--nixl-host", host.address, "--nixl-port", str(NIXL_PORT + slot),
                     "--kv-cache-gib", "1", "--core", str(core)]
        self._add(f"{role}-{_tag(host)}", "worker", host, core, ep, args)

    @property
    def frontends(self) -> list[Svc]:
        return [s for s in self.services.values() if s.kind == "frontend"]

    @property
    def routers(self) -> list[Svc]:
        return [s for s in self.services.values() if s.kind == "router"]

    @property
    def workers(self) -> list[Svc]:
        return [s for s in self.services.values() if s.kind == "worker"]

    def spawn(self, svc: Svc) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        pin = None if (self.engine != "mock" and svc.kind == "worker") else svc.core  # vLLM pins itself (--core)
        svc.proc = svc.host.spawn([sys.executable, "-m", "cli.main", *svc.args], env,
                                  self.log_dir / f"chaos-{svc.name}.log", core=pin, cwd=str(REPO))

    def start(self, timeout_s: float = 120.0) -> float:
        t0 = time.monotonic()
        for svc in self.services.values():
            self.spawn(svc)
        self.wait_ready(timeout_s)
        return time.monotonic() - t0

    def restart(self, svc: Svc) -> None:
        assert svc.proc is not None
        svc.proc.wait(30)
        svc.num_restarts += 1
        self.spawn(svc)

    def supervise(self, stop: threading.Event, t0: float, every_s: float = 0.5) -> None:
        """Until ``stop``: restart any service that exited by itself, as `up` does (a worker whose engine died exits
        for exactly that). Runs on a thread of its own."""
        while not stop.wait(every_s):
            for svc in self.services.values():
                with self.lock:
                    code = None if svc.proc is None else svc.proc.poll()
                    if code is None:
                        continue
                    self.self_exits.append({"at_s": round(time.monotonic() - t0, 2), "service": svc.name,
                                            "returncode": code})
                    print("self_exit", json.dumps(self.self_exits[-1]), flush=True)
                    self.restart(svc)

    def health(self, frontend: Svc) -> dict:
        try:
            with urllib.request.urlopen(frontend.endpoint + "/health", timeout=2) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):
            return {}

    def ready(self) -> bool:
        want_p = sum(1 for w in self.workers if "--role" in w.args and w.args[w.args.index("--role") + 1] == "prefill")
        want_d = len(self.workers) - want_p
        for fe in self.frontends:
            h = self.health(fe)
            if h.get("num_prefill_workers") != want_p or h.get("num_decode_workers") != want_d:
                return False
        return True

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if dead := [s.name for s in self.services.values() if s.proc and s.proc.poll() is not None]:
                raise RuntimeError(f"exited before ready: {dead}; logs in {self.log_dir}/chaos-*.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready in {timeout_s}s; logs in {self.log_dir}/chaos-*.log")
            time.sleep(0.3)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (and SIGCONT, for one caught stopped) to every service at once; SIGKILL what is left after
        ``timeout_s``."""
        procs = [s.proc for s in self.services.values() if s.proc is not None]
        for proc in procs:
            proc.signal(signal.SIGTERM)
            proc.signal(signal.SIGCONT)
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGCONT)  # nsenter stopped itself with its child
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            proc.stop(max(0.1, deadline - time.monotonic()))


def _tag(host: Host) -> str:
    return chr(ord("a") + host.index)


def _node(host: Host) -> str:
    return f"host-{_tag(host)}"
