"""`splitserve up`: start router, workers and frontend as child processes; stop them all on exit.

Each child is a plain `python -m cli.main <service>` process, the same command a systemd unit runs. Children
die with the launcher (PR_SET_PDEATHSIG, which each sets on itself at start: cli/child_setup.py), so a killed
launcher leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import structlog

from cli.child_setup import launcher_env
from cli.cpu_sched import batch_scheduled, engine_cores
from cli.placement import control_plane_env
from cli.children import Child, ChildSet
from cli.graph_spec import (  # noqa: F401 (re-exported: tests and benchmarks import them from here)
    DEFAULT_MODEL_DIR,
    GraphSpec,
    PlannerSpec,
    control_plane_cores,
    frontend_commands,
    frontends_that_fit,
    kvtier_block_bytes,
    kvtier_command,
    planner_command,
    router_command,
    worker_command,
    worker_commands,
    worker_roles,
)
from cli.graph_keys import check_graph_keys, graph_keys, graph_services, scaler_keys
from cli.metrics_targets import default_sd_path, metrics_target, write_sd_file
from cli.ports import _ephemeral_range, free_port, port_in_use  # noqa: F401 (re-exported)
from cli.scaling import PoolMember, ScaleEvents, scale_actions
from common.errors import SplitserveError

log = structlog.get_logger(__name__)


def launch(spec: GraphSpec) -> int:
    if port_in_use(spec.host, spec.port):
        # Another graph's, most likely: fail before touching anything of its own (its target list included).
        log.error("port_in_use", host=spec.host, port=spec.port)
        return 1
    if spec.curve_dir is not None:
        try:
            check_graph_keys(spec.curve_dir, graph_services(spec.kvtier, spec.planner is not None))
        except SplitserveError as exc:  # one line now, not every child failing its start
            log.error("curve_keys_unusable", error=str(exc))
            return 2
    with graph_keys(spec.curve_dir, spec.curve) as keys:
        return _launch(spec, keys)


def with_options(cmd: list[str], options: list[str]) -> list[str]:
    """``options`` are the service's own: before a worker's `--` (what follows it is vLLM's)."""
    if "--" not in cmd:
        return [*cmd, *options]
    split = cmd.index("--")
    return [*cmd[:split], *options, *cmd[split:]]


def _launch(spec: GraphSpec, curve_root: Path | None) -> int:
    from cli.shm_tracker import sweep_stale_records

    # Semaphores and segments a killed graph's engine trees left in /dev/shm (their trackers died with them).
    if removed := sweep_stale_records():
        log.info("shm_leftovers_removed", num_files=len(removed))
    model = spec.model or DEFAULT_MODEL_DIR
    if spec.model is None and not (model / "config.json").exists():
        from common.tiny_model import make_tiny_model

        log.info("making_tiny_model", path=str(model))
        make_tiny_model(model)
    # Router replicas: everyone else gets the comma-separated list (workers and kvtier feed each, frontends use any).
    num_routers = spec.num_frontends if spec.router_in_frontend else spec.num_routers
    router_endpoints = [f"tcp://127.0.0.1:{spec.router_port or free_port()}"]
    router_endpoints += [f"tcp://127.0.0.1:{free_port()}" for _ in range(num_routers - 1)]
    router = ",".join(router_endpoints)
    common = ["--log-level", spec.log_level] + (["--log-json"] if spec.log_json else [])
    if curve_root is not None:  # each child loads its own <service>/ from the root
        common += ["--curve-dir", str(curve_root)]
        log.info("curve_on", keys=str(curve_root), fresh=spec.curve)
    routers = [router_command(spec, endpoint, i) for i, endpoint in enumerate(router_endpoints)]
    commands = [] if spec.router_in_frontend else list(routers)
    # One kvtier for every engine (vLLM workers reach it through our KV connector).
    kvtier = f"tcp://127.0.0.1:{free_port()}" if spec.kvtier else ""
    if kvtier:
        commands.append(kvtier_command(spec, router, kvtier))
    workers = worker_commands(spec, model, router, kvtier)
    commands += workers
    frontends = frontend_commands(spec, model, router)
    if spec.router_in_frontend:  # frontend i hosts replica i (its options as `splitserve router` takes them)
        frontends = [[*cmd, "--router-inside", shlex.join(r[1:])] for cmd, r in zip(frontends, routers)]
    commands += frontends
    planner_events = f"tcp://127.0.0.1:{free_port()}" if spec.planner is not None else ""
    if planner_events:
        urls = [f"http://{t.address}/metrics" for t in map(metrics_target, frontends) if t is not None]
        commands.append(planner_command(spec, router, planner_events, urls))
    # `up`'s engine arguments reach its workers as arguments; a deploy file's SPLITSERVE_ENGINE_ARGS in this shell
    # must not add to them behind the user's back.
    env = {**{k: v for k, v in os.environ.items() if k != "SPLITSERVE_ENGINE_ARGS"}, "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    control_cores = (control_plane_cores(worker_roles(spec), os.cpu_count() or 1)
                     if spec.engine == "vllm" and spec.pin_control_plane else frozenset())
    if control_cores:
        log.info("control_plane_pinned", cores=sorted(control_cores))
    engine_core_ids = engine_cores(len(worker_roles(spec)), os.cpu_count() or 1)
    batched = {s for s in ("frontend", "router", "kvtier", "planner", "worker")
               if batch_scheduled(s, spec.engine, spec.cpu_sched, control_cores, engine_core_ids)}
    if batched:
        log.info("sched_batch", services=sorted(batched))
    sd_path = spec.metrics_sd_file or default_sd_path(spec.port)

    def publish_targets(now: Sequence[Child]) -> None:
        # Every process alive or starting, draining ones included (they serve until they exit).
        targets = [t for t in (metrics_target(c.cmd) for c in now) if t is not None]
        write_sd_file(sd_path, targets)
        log.info("metrics_targets_written", path=str(sd_path), num_targets=len(targets))

    children = ChildSet(on_change=publish_targets)
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
        # The child sets its cores and parent-death signal itself (cli/child_setup.py): no preexec_fn in a
        # launcher with ZeroMQ threads running.
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", *with_options(cmd, common)], start_new_session=True,
                                env={**env, **control_plane_env(cmd[0]),
                                     **launcher_env(os.getpid(), cores, cmd[0] in batched)})
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
            children.add(child)
            log.info("worker_started", worker_id=child.worker_id, pid=child.proc.pid, target=target)
        for child in children:
            if child.worker_id in actions.drain:
                child.draining = True
                _signal_leader(child.proc, signal.SIGTERM)  # the worker drains, then exits 0
                log.info("worker_draining", worker_id=child.worker_id, pid=child.proc.pid, target=target)

    def moved(worker_id: str, role: str) -> None:
        for child in children:
            if child.worker_id == worker_id and child.role:
                child.role = role
                child.cmd[child.cmd.index("--role") + 1] = role  # a restart comes back in its new pool
                log.info("worker_moved", worker_id=worker_id, role=role)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    events = ScaleEvents(planner_events, scaler_keys(curve_root)) if planner_events else None
    try:
        for cmd in commands:
            children.add(spawn(cmd))  # one at a time: a failed start still stops those already started
        url = f"http://{spec.host}:{spec.port}"
        ready = False
        ready_wall_s = 0.0  # epoch s the graph was first ready: scale requests decided earlier are stale
        deadline = time.monotonic() + spec.ready_timeout_s
        while not stopping:
            for child in children:
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
                # The same command, so the same metrics port: its scrape target and series carry on.
                children.replace(child, spawn(child.cmd))
            if not ready:
                # Every model's workers (`--model` repeated): a graph is not serving while one model has none.
                ready = _healthy(url, sum(1 for child in children if child.role))
                if ready:
                    ready_wall_s = time.time()
                    log.info("serving", url=f"{url}/v1", model=model.resolve().name, engine=spec.engine,
                             prefill=spec.num_prefill, decode=spec.num_decode, aggregated=spec.num_aggregated,
                             planner=spec.planner is not None, frontends=spec.num_frontends)
                    print(f"splitserve is serving {url}/v1 (model {model.resolve().name!r}); Ctrl-C stops it\n"
                          f"Prometheus targets (file_sd_configs): {sd_path}", flush=True)
                elif time.monotonic() > deadline:
                    log.error("not_ready", timeout_s=spec.ready_timeout_s)
                    return 1
            elif events is not None:
                targets = events.poll(not_before_s=ready_wall_s)
                for worker_id, role in events.take_roles().items():
                    moved(worker_id, role)
                for pool, target in targets.items():
                    scale(pool, target)
            time.sleep(0.2)
        return 0
    finally:
        if events is not None:
            events.close()
        _stop_all(children.procs())
        sd_path.unlink(missing_ok=True)  # a stopped graph is no outage: Prometheus drops its targets


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
