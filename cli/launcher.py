"""`splitserve up`: start router, workers and frontend as child processes; stop them all on exit.

Each child is a plain `python -m cli.main <service>` process, the same command a systemd unit runs. Children
die with the launcher (PR_SET_PDEATHSIG), so a killed launcher leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import json
import os
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

log = structlog.get_logger(__name__)

DEFAULT_MODEL_DIR = Path("models/tiny")


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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def kvtier_command(spec: GraphSpec, router: str, endpoint: str) -> list[str]:
    cmd = ["kvtier", "--endpoint", endpoint, "--router", router, "--host-cache-gb", str(spec.host_cache_gb),
           "--disk-cache-gb", str(spec.disk_cache_gb), "--block-bytes", str(kvtier_block_bytes(spec))]
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

    info = validate_model_dir(spec.model or DEFAULT_MODEL_DIR)
    dtype = info.torch_dtype if spec.dtype == "auto" else spec.dtype
    return info.kv_bytes_per_token(2 if dtype in ("bfloat16", "float16", "half") else 4) * spec.block_size


def worker_commands(spec: GraphSpec, model: Path, router: str, kvtier: str = "") -> list[list[str]]:
    roles = ["prefill"] * spec.num_prefill + ["decode"] * spec.num_decode + ["both"] * spec.num_aggregated
    num_cores = os.cpu_count() or 1
    cmds = []
    for i, role in enumerate(roles):
        cmd = ["worker", "--model", str(model), "--role", role, "--router", router, "--engine", spec.engine,
               "--block-size", str(spec.block_size), "--worker-id", f"{role}-{i}",
               "--mock-speedup", str(spec.mock_speedup), "--dtype", spec.dtype,
               "--nixl-port", str(free_port()), "--core", str(i % num_cores)]
        if spec.num_blocks is not None:
            cmd += ["--num-blocks", str(spec.num_blocks)]
        if spec.mock_profile is not None:
            cmd += ["--mock-profile", str(spec.mock_profile)]
        if kvtier:
            cmd += ["--kvtier", kvtier]
        cmds.append(cmd)
    return cmds


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
    commands += worker_commands(spec, model, router, kvtier)
    commands.append(["frontend", "--model", str(model), "--router", router, "--host", spec.host,
                     "--port", str(spec.port)])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    children: list[subprocess.Popen[bytes]] = []
    restarts: list[float] = []
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    def spawn(cmd: list[str]) -> subprocess.Popen[bytes]:
        # Each service leads its own process group, so stopping it also stops what it started (vLLM's engine
        # core and worker processes), even if the service itself dies first.
        return subprocess.Popen([sys.executable, "-m", "cli.main", *cmd, *common], env=env,
                                preexec_fn=_die_with_parent, start_new_session=True)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        children.extend(spawn(cmd) for cmd in commands)
        url = f"http://{spec.host}:{spec.port}"
        ready = False
        deadline = time.monotonic() + spec.ready_timeout_s
        while not stopping:
            for i, child in enumerate(children):
                if child.poll() is None:
                    continue
                # Like systemd's Restart=on-failure: bring a crashed service back, unless it keeps crashing.
                now = time.monotonic()
                restarts[:] = [t for t in restarts if now - t < 60.0] + [now]
                log.error("child_exited", service=commands[i][0], args=" ".join(commands[i][1:6]),
                          returncode=child.returncode, num_recent_restarts=len(restarts))
                if not ready or len(restarts) > spec.max_restarts_per_min:
                    return 1
                _signal_group(child, signal.SIGKILL)  # what the dead service left running (engine processes)
                children[i] = spawn(commands[i])
            if not ready:
                ready = _healthy(url, spec.num_prefill + spec.num_decode + spec.num_aggregated)
                if ready:
                    log.info("serving", url=f"{url}/v1", model=model.resolve().name, engine=spec.engine,
                             prefill=spec.num_prefill, decode=spec.num_decode, aggregated=spec.num_aggregated)
                    print(f"splitserve is serving {url}/v1 (model {model.resolve().name!r}); Ctrl-C stops it",
                          flush=True)
                elif time.monotonic() > deadline:
                    log.error("not_ready", timeout_s=spec.ready_timeout_s)
                    return 1
            time.sleep(0.2)
        return 0
    finally:
        _stop_all(children)


def _healthy(url: str, num_workers: int) -> bool:
    """Healthy and every worker registered (a graph serving before its prefill pool is up would mislead)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
            return resp.status == 200 and json.loads(resp.read()).get("num_workers", 0) >= num_workers
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _stop_all(children: list[subprocess.Popen[bytes]], grace_s: float = 15.0) -> None:
    # Frontend first (stops taking requests), then workers, then the router.
    for child in reversed(children):
        _signal_group(child, signal.SIGTERM)
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


def _signal_group(child: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass
