"""`splitserve up`: start router, workers and frontend as child processes; stop them all on exit.

Each child is a plain `python -m cli.main <service>` process, the same command a systemd unit runs. Children
die with the launcher (PR_SET_PDEATHSIG), so a killed launcher leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import structlog

from cli.scaling import PoolMember, ScaleEvents, scale_actions

log = structlog.get_logger(__name__)

DEFAULT_MODEL_DIR = Path("models/tiny")


@dataclass(frozen=True)
class PlannerSpec:
    """`up --planner`: a planner process whose ScaleRequests this launcher carries out."""

    slo: str  # ttft_ms=..,itl_ms=..
    profile: Path | None = None
    interval_s: float = 5.0
    window_s: float = 30.0
    max_prefill: int = 4
    max_decode: int = 4
    max_workers: int = 8
    decisions_path: Path | None = None


@dataclass(frozen=True)
class GraphSpec:
    model: Path | None = None
    engine: str = "vllm"
    num_prefill: int = 1
    num_decode: int = 1
    num_aggregated: int = 0
    router_policy: str = "kv"
    local_prefill_max_tokens: int = 256
    block_size: int = 32
    num_blocks: int | None = None
    mock_speedup: float = 1.0
    mock_profile: Path | None = None  # mock timing from a `splitserve profile` JSON
    # The shared KV tier (kvtier): mock workers offload evicted blocks to it and onboard prefixes from it.
    kvtier: bool = True
    host_cache_gb: float = 1.0
    disk_cache_gb: float = 0.0
    disk_cache_dir: Path | None = None
    kvtier_metrics_port: int = 0
    dtype: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8000
    router_port: int = 0  # 0: any free port
    router_metrics_port: int = 0  # 0: the router serves no Prometheus metrics
    router_prefill_weight: float | None = None  # None: the router's default
    router_busy_threshold: float | None = None
    log_level: str = "info"
    log_json: bool = False
    # Seconds to wait for /health to turn 200 (vLLM engines take seconds to a minute to start).
    ready_timeout_s: float = 300.0
    # Crashed children are restarted; more crashes than this in a minute stop the whole graph.
    max_restarts_per_min: int = 5
    planner: PlannerSpec | None = None  # None: fixed pools
    # Tokens a decode worker computes per step (0: the engine's default). Small values chunk its local
    # prefills over several steps, bounding the inter-token gap they cause to the decoding streams.
    decode_max_batched_tokens: int = 0
    # vLLM: frontend, router, kvtier and planner on control_plane_cores (never a decode engine's core).
    pin_control_plane: bool = True


_handed_out: set[int] = set()  # ports this process chose and a child has not necessarily bound yet


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now, for a child to bind later, outside the kernel's ephemeral range.

    Between our check and the child's bind, any process binding port 0 (vLLM's own ZeroMQ sockets, UCX) could
    be handed an ephemeral port; one of ours outside that range cannot be (seen in CI: a NIXL side-channel port
    taken, "Address already in use", the engine never ready). Never the same port twice per launcher.
    """
    lo, _ = _ephemeral_range()
    first = 10_000
    for _ in range(200):
        port = random.randrange(first, lo) if lo - first > 1000 else 0
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            port = s.getsockname()[1]
        _handed_out.add(port)
        return port
    raise OSError(f"no free TCP port on {host} below {lo}")


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _child_setup(cores: frozenset[int]) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG: stop at once (SIGTERM would make a worker drain)
    allowed = os.sched_getaffinity(0)
    if cores and cores <= allowed:
        os.sched_setaffinity(0, cores)


def kvtier_command(spec: GraphSpec, router: str, endpoint: str) -> list[str]:
    cmd = ["kvtier", "--endpoint", endpoint, "--router", router, "--host-cache-gb", str(spec.host_cache_gb),
           "--disk-cache-gb", str(spec.disk_cache_gb), "--block-bytes", str(kvtier_block_bytes(spec))]
    cmd += ["--tier-id", "kvtier-0"]  # `up` runs one tier (kvtier's own default, kvtier-NODE, is per machine)
    if spec.disk_cache_dir is not None:
        cmd += ["--disk-cache-dir", str(spec.disk_cache_dir)]
    if spec.kvtier_metrics_port:
        cmd += ["--metrics-port", str(spec.kvtier_metrics_port)]
    return cmd


def kvtier_block_bytes(spec: GraphSpec) -> int:
    """kvtier's slot: one block of every layer's K and V. Mock: 36,864 KV bytes per token (its modelled ~100M
    engine, bf16). vLLM: from the model's config, 2 bytes per element for 16-bit dtypes, else 4 (fp32)."""
    if spec.engine == "mock":
        return 36864 * spec.block_size
    from common.tiny_model import validate_model_dir
    from services.worker.engines.vllm.dtype import resolved_dtype

    info = validate_model_dir(spec.model or DEFAULT_MODEL_DIR)
    # As each engine resolves it (on a CPU without native bf16, `auto` is float32); "auto" left: the model's.
    dtype = resolved_dtype(spec.dtype, info.torch_dtype, on_cuda=shutil.which("nvidia-smi") is not None).dtype
    dtype = info.torch_dtype if dtype == "auto" else dtype
    return info.kv_bytes_per_token(2 if dtype in ("bfloat16", "float16", "half") else 4) * spec.block_size


def worker_command(spec: GraphSpec, model: Path, router: str, role: str, index: int, kvtier: str = "") -> list[str]:
    num_cores = os.cpu_count() or 1
    cmd = ["worker", "--model", str(model), "--role", role, "--router", router, "--engine", spec.engine,
           "--block-size", str(spec.block_size), "--worker-id", f"{role}-{index}",
           "--mock-speedup", str(spec.mock_speedup), "--dtype", spec.dtype,
           "--nixl-port", str(free_port()), "--core", str(index % num_cores)]
    if spec.num_blocks is not None:
        cmd += ["--num-blocks", str(spec.num_blocks)]
    if spec.mock_profile is not None:
        cmd += ["--mock-profile", str(spec.mock_profile)]
    if kvtier:
        cmd += ["--kvtier", kvtier]
    if role == "decode" and spec.decode_max_batched_tokens:
        cmd += ["--max-num-batched-tokens", str(spec.decode_max_batched_tokens)]
    return cmd


def worker_roles(spec: GraphSpec) -> list[str]:
    """Role of each initial worker; worker ``i`` is pinned to core ``i % num_cores`` (worker_command)."""
    return ["prefill"] * spec.num_prefill + ["decode"] * spec.num_decode + ["both"] * spec.num_aggregated


def worker_commands(spec: GraphSpec, model: Path, router: str, kvtier: str = "") -> list[list[str]]:
    return [worker_command(spec, model, router, role, i, kvtier) for i, role in enumerate(worker_roles(spec))]


def control_plane_cores(roles: list[str], num_cores: int) -> frozenset[int]:
    """Cores for the frontend, router, kvtier and planner of a vLLM graph; empty: leave them unpinned.

    Decode latency is what disaggregation protects, so the control plane never shares a decode engine's core:
    it takes the cores no engine uses, else the prefill engines' (a prefill is throughput-bound; measured on
    2 cores, an unpinned frontend, router and client drifted onto the decode core whenever a long prefill held
    the other one). An aggregated graph with no free core has nowhere better: unpinned.
    """
    free = frozenset(range(num_cores)) - {i % num_cores for i in range(len(roles))}
    if free:
        return free
    prefill = {i % num_cores for i, role in enumerate(roles) if role == "prefill"}
    latency_bound = {i % num_cores for i, role in enumerate(roles) if role != "prefill"}  # decode, both
    return frozenset(prefill - latency_bound)


def planner_command(spec: GraphSpec, router: str, events: str) -> list[str]:
    assert spec.planner is not None
    p = spec.planner
    cmd = ["planner", "--router", router, "--metrics-url", f"http://{spec.host}:{spec.port}/metrics",
           "--events", events, "--slo", p.slo, "--interval-s", str(p.interval_s),
           "--window-s", str(p.window_s),
           "--max-prefill", str(p.max_prefill), "--max-decode", str(p.max_decode),
           "--max-workers", str(p.max_workers)]
    if p.profile is not None:
        cmd += ["--profile", str(p.profile)]
    if p.decisions_path is not None:
        cmd += ["--decisions", str(p.decisions_path)]
    return cmd


@dataclass
class Child:
    service: str
    cmd: list[str]
    proc: subprocess.Popen[bytes]
    started_s: float
    role: str = ""  # workers: prefill | decode | both
    worker_id: str = ""
    draining: bool = False


def launch(spec: GraphSpec) -> int:
    model = spec.model or DEFAULT_MODEL_DIR
    if spec.model is None and not (model / "config.json").exists():
        from common.tiny_model import make_tiny_model

        log.info("making_tiny_model", path=str(model))
        make_tiny_model(model)
    router = f"tcp://127.0.0.1:{spec.router_port or free_port()}"
    common = ["--log-level", spec.log_level] + (["--log-json"] if spec.log_json else [])
    commands = [["router", "--endpoint", router, "--policy", spec.router_policy,
                 "--local-prefill-max-tokens", str(spec.local_prefill_max_tokens)]
                + (["--metrics-port", str(spec.router_metrics_port)] if spec.router_metrics_port else [])
                + (["--prefill-weight", str(spec.router_prefill_weight)] if spec.router_prefill_weight is not None else [])
                + (["--busy-threshold", str(spec.router_busy_threshold)] if spec.router_busy_threshold is not None else [])]
    # One kvtier for every engine (vLLM workers reach it through our KV connector).
    kvtier = f"tcp://127.0.0.1:{free_port()}" if spec.kvtier else ""
    if kvtier:
        commands.append(kvtier_command(spec, router, kvtier))
    workers = worker_commands(spec, model, router, kvtier)
    commands += workers
    commands.append(["frontend", "--model", str(model), "--router", router, "--host", spec.host,
                     "--port", str(spec.port)])
    planner_events = f"tcp://127.0.0.1:{free_port()}" if spec.planner is not None else ""
    if planner_events:
        commands.append(planner_command(spec, router, planner_events))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    control_cores = (control_plane_cores(worker_roles(spec), os.cpu_count() or 1)
                     if spec.engine == "vllm" and spec.pin_control_plane else frozenset())
    if control_cores:
        log.info("control_plane_pinned", cores=sorted(control_cores))
    children: list[Child] = []
    restarts: list[float] = []
    stopping = False
    next_worker_index = len(workers)

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    def spawn(cmd: list[str]) -> Child:
        # Each service leads its own process group, so stopping it also stops what it started (vLLM's engine
        # core and worker processes), even if the service itself dies first.
        cores = frozenset() if cmd[0] == "worker" else control_cores  # a worker pins itself to its --core
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", *cmd, *common], env=env,
                                preexec_fn=lambda: _child_setup(cores), start_new_session=True)
        child = Child(service=cmd[0], cmd=cmd, proc=proc, started_s=time.monotonic())
        if cmd[0] == "worker":
            child.role, child.worker_id = cmd[cmd.index("--role") + 1], cmd[cmd.index("--worker-id") + 1]
        return child

    def scale(pool: str, target: int) -> None:
        nonlocal next_worker_index
        role = "both" if spec.num_aggregated and pool == "decode" else pool
        if spec.num_aggregated and pool == "prefill":
            return  # an aggregated graph has no prefill pool
        members = [PoolMember(c.worker_id, c.role, c.started_s, c.draining)  # type: ignore[arg-type]
                   for c in children if c.role]
        actions = scale_actions(members, role, target, spec.planner.max_workers if spec.planner else 0)  # type: ignore[arg-type]
        for _ in range(actions.start):
            child = spawn(worker_command(spec, model, router, role, next_worker_index, kvtier))
            next_worker_index += 1
            children.append(child)
            log.info("worker_started", worker_id=child.worker_id, pid=child.proc.pid, target=target)
        for child in children:
            if child.worker_id in actions.drain:
                child.draining = True
                _signal_leader(child.proc, signal.SIGTERM)  # the worker drains, then exits 0
                log.info("worker_draining", worker_id=child.worker_id, pid=child.proc.pid, target=target)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    events = ScaleEvents(planner_events) if planner_events else None
    try:
        children.extend(spawn(cmd) for cmd in commands)
        url = f"http://{spec.host}:{spec.port}"
        ready = False
        deadline = time.monotonic() + spec.ready_timeout_s
        while not stopping:
            for i, child in enumerate(list(children)):
                if child.proc.poll() is None:
                    continue
                if child.draining or (child.role and child.proc.returncode == 0):
                    # Drained: on our request, or an operator's SIGTERM (a worker exits 0 only after draining).
                    log.info("worker_drained", worker_id=child.worker_id, returncode=child.proc.returncode)
                    _signal_group(child.proc, signal.SIGKILL)  # its engine processes, if any are left
                    children.remove(child)
                    continue
                # Like systemd's Restart=on-failure: bring a crashed service back, unless it keeps crashing.
                now = time.monotonic()
                restarts[:] = [t for t in restarts if now - t < 60.0] + [now]
                log.error("child_exited", service=child.service, args=" ".join(child.cmd[1:6]),
                          returncode=child.proc.returncode, num_recent_restarts=len(restarts))
                if not ready or len(restarts) > spec.max_restarts_per_min:
                    return 1
                _signal_group(child.proc, signal.SIGKILL)  # what the dead service left running (engine processes)
                children[children.index(child)] = spawn(child.cmd)
            if not ready:
                ready = _healthy(url, spec.num_prefill + spec.num_decode + spec.num_aggregated)
                if ready:
                    log.info("serving", url=f"{url}/v1", model=model.resolve().name, engine=spec.engine,
                             prefill=spec.num_prefill, decode=spec.num_decode, aggregated=spec.num_aggregated,
                             planner=spec.planner is not None)
                    print(f"splitserve is serving {url}/v1 (model {model.resolve().name!r}); Ctrl-C stops it",
                          flush=True)
                elif time.monotonic() > deadline:
                    log.error("not_ready", timeout_s=spec.ready_timeout_s)
                    return 1
            elif events is not None:
                for pool, target in events.poll().items():
                    scale(pool, target)
            time.sleep(0.2)
        return 0
    finally:
        if events is not None:
            events.close()
        _stop_all([c.proc for c in children])


def _healthy(url: str, num_workers: int) -> bool:
    """Healthy and every worker registered (a graph serving before its prefill pool is up would mislead)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
            return resp.status == 200 and json.loads(resp.read()).get("num_workers", 0) >= num_workers
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _stop_all(children: list[subprocess.Popen[bytes]], grace_s: float = 15.0) -> None:
    # Frontend first (stops taking requests), then workers, then the router. SIGINT, not SIGTERM: a worker
    # drains on SIGTERM (finishes its requests), and a graph being stopped has no one left to serve them to.
    for child in reversed(children):
        _signal_leader(child, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for child in reversed(children):
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("child_killed", pid=child.pid, grace_s=grace_s)
        # Whatever is left in the group (a leader that hung, or its orphaned engine processes) is killed.
        _signal_group(child, signal.SIGKILL)
        child.wait()
    log.info("stopped", num_processes=len(children))


def _signal_leader(child: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        child.send_signal(sig)
    except ProcessLookupError:
        pass


def _signal_group(child: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass
