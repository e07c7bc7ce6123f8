"""The systems bench/peers.py compares, each started on the same engines, model and cores, and stopped again.

splitserve arms are `splitserve up` graphs (tests/harness/graph.py); vLLM arms are vLLM's own OpenAI servers
(tests/harness/vllm_server.py: `python -m vllm.entrypoints.openai.api_server`, one per core, taskset and
VLLM_CPU_OMP_THREADS_BIND) behind vllm-router (PyPI `vllm-router`, the `bench` extra). Placement is the same for
both systems: the prefill engine (and its whole process tree) on core 0, the decode engine on core 1; the
control plane (splitserve's frontend and router, vllm-router) and the load generator where `up` puts its control
plane (P/D: the prefill core; aggregated: no core is free of an engine, so they float).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bench.lib.machine import REPO
from bench.lib.procs import proc_cpu_s, tree_pids
from cli.ports import free_port
from services.worker.engines.vllm.nixl import QUALNAME as NIXL_FIX
from tests.harness.graph import start_graph
from tests.harness.vllm_server import VllmServer, start_vllm_server

PREFILL_CORE, DECODE_CORE = 0, 1
# What splitserve's CPU engines run with where the user says nothing (services/worker/engines/vllm/engine.py
# CPU_DEFAULTS, config.py engine_process_env): the "alike" vLLM arms get the same.
ALIKE_ARGS = ("--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--worker-extension-cls", NIXL_FIX)
ALIKE_ENV = {"THP_MEM_ALLOC_ENABLE": "1"}
# A splitserve prefill engine's own CPU defaults (engine.py PREFILL_CPU_DEFAULTS, since 2026-12-07): the alike
# vLLM P/D's prefill server gets them too.
ALIKE_PREFILL_ARGS = ("--max-num-batched-tokens", "512", "--long-prefill-token-threshold", "256")


@dataclass(frozen=True)
class Arm:
    name: str
    system: str  # splitserve | vllm
    what: str
    pd: bool  # one prefill + one decode engine (else two aggregated engines)
    up_args: tuple[str, ...] = ()  # splitserve: `up` arguments
    alike: bool = False  # vLLM: engines set like splitserve's (ALIKE_ARGS, ALIKE_ENV)
    kv_transfer: str = ""  # splitserve P/D: pull | push ("" : the run's --kv-transfer)
    kvtier: bool = False  # splitserve: with its shared KV tier (host memory) beside the engines


ARMS = {a.name: a for a in (
    Arm("ss-pd", "splitserve", "splitserve P/D, `up` defaults (pull since 2026-12-06, push before; prompts <= "
        "--local-prefill-max-tokens prefilled on the decode engine; the first token sent with the decode worker's "
        "first)", True, ("--prefill", "1", "--decode", "1")),
    Arm("ss-pd-push", "splitserve", "splitserve P/D, `up` defaults but KV pushed by the prefill engine "
        "(--kv-transfer push, vLLM's NixlPushConnector; `up`'s default before 2026-12-06)", True,
        ("--prefill", "1", "--decode", "1"), kv_transfer="push"),
    Arm("ss-pd-early", "splitserve", "splitserve P/D, `up` defaults but the first token streamed as soon as the "
        "prefill worker has it (--first-token prefill, the default before issue 29)", True,
        ("--prefill", "1", "--decode", "1", "--first-token", "prefill")),
    Arm("ss-pd-float", "splitserve", "splitserve P/D, `up` defaults but the frontend and router not pinned to the "
        "prefill engine's core (--no-pin-control-plane: the kernel places them, as vLLM's decode server detokenizes "
        "on the decode core)", True, ("--prefill", "1", "--decode", "1", "--no-pin-control-plane")),
    Arm("ss-pd-pull", "splitserve", "splitserve P/D, `up` defaults but KV pulled by the decode engine (--kv-transfer pull, as "
        "vLLM's NixlConnector)", True, ("--prefill", "1", "--decode", "1"), kv_transfer="pull"),
    Arm("ss-pd-remote", "splitserve", "splitserve P/D, every prompt prefilled remotely (--local-prefill-max-tokens 0)",
        True, ("--prefill", "1", "--decode", "1", "--local-prefill-max-tokens", "0")),
    Arm("ss-pd-batch", "splitserve", "splitserve P/D, `up` defaults but the control plane (on the prefill engine's "
        "core) under SCHED_BATCH (--cpu-sched batch; auto leaves a control plane that shares an engine's core "
        "as it is)", True, ("--prefill", "1", "--decode", "1", "--cpu-sched", "batch")),
    Arm("ss-pd-tier", "splitserve", "splitserve P/D, `up` defaults with its KV tier (kvtier, a host-memory pool "
        "on the prefill core): blocks the engines evict come back from host memory on a prefix hit", True,
        ("--prefill", "1", "--decode", "1"), kvtier=True),
    Arm("ss-agg", "splitserve", "splitserve aggregated: 2 workers role both, KV-aware routing", False,
        ("--aggregated", "2")),
    Arm("vllm-pd", "vllm", "vLLM P/D: 2 vLLM servers (NixlConnector kv_both) behind vllm-router "
        "--vllm-pd-disaggregation round_robin, engines set like splitserve's", True, alike=True),
    Arm("vllm-pd-shipped", "vllm", "vLLM P/D as shipped (no CPU NIXL fix, vLLM's batch defaults)", True),
    Arm("vllm-agg", "vllm", "2 aggregated vLLM servers behind vllm-router --policy cache_aware, set like "
        "splitserve's", False, alike=True),
)}


@dataclass
class Running:
    url: str
    pids: dict[str, int]  # label -> top process (its tree is measured too)
    stop: Callable[[], None]
    facts: dict = field(default_factory=dict)


def process_cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds of every process of a system: ``label`` for each top process, ``label/<comm>`` for each
    descendant (vLLM's EngineCore and model worker processes), summed over descendants of one name."""
    out: dict[str, float] = {}
    for label, top in pids.items():
        for pid in tree_pids(top):
            try:
                name = label if pid == top else f"{label}/{Path(f'/proc/{pid}/comm').read_text().strip()}"
                out[name] = round(out.get(name, 0.0) + proc_cpu_s(pid), 3)
            except OSError:
                continue
    return out


def start_arm(arm: Arm, model: Path, dtype: str, log_dir: Path, kv_transfer: str, index: int,
              num_blocks: int | None = None, log_level: str = "warning") -> Running:
    """``num_blocks``: KV blocks per engine in every arm (splitserve `--num-blocks`, vLLM
    `--num-gpu-blocks-override`), to make a workload's prefixes outgrow the engines' caches alike. ``log_level``:
    splitserve's services' (debug: the router's every route, to trace a run's misses)."""
    if arm.system == "splitserve":
        return _splitserve(arm, model, dtype, log_dir, kv_transfer, index, num_blocks, log_level)
    return _vllm(arm, model, dtype, log_dir, index, num_blocks)


def _splitserve(arm: Arm, model: Path, dtype: str, log_dir: Path, kv_transfer: str, index: int,
                num_blocks: int | None, log_level: str) -> Running:
    args = ["--engine", "vllm", "--model", str(model), "--dtype", dtype, "--block-size", "32",
            "--log-level", log_level, *arm.up_args]
    if not arm.kvtier:
        args.append("--no-kvtier")
    if num_blocks:
        args += ["--num-blocks", str(num_blocks)]
    if arm.pd:
        args += ["--kv-transfer", arm.kv_transfer or kv_transfer]
    graph = start_graph(log_dir, *args, ready_timeout_s=300.0, log_name=f"peers-{index}-{arm.name}.log")
    return Running(graph.url, graph.pids(), graph.stop, {"command": " ".join(graph.cmd[1:]),
                                                          "start_s": round(graph.startup_s, 1)})


def _router_bin() -> str:
    found = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")
    if not Path(found).exists():
        raise SystemExit("vllm-router not found: pip install -e '.[bench]' (vllm-router==0.1.17)")
    return found


def _vllm(arm: Arm, model: Path, dtype: str, log_dir: Path, index: int, num_blocks: int | None) -> Running:
    began = time.monotonic()
    name = model.resolve().name
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
           **(ALIKE_ENV if arm.alike else {})}
    engine = ["--dtype", dtype, *(ALIKE_ARGS if arm.alike else ())]
    if num_blocks:
        engine += ["--num-gpu-blocks-override", str(num_blocks)]
    if arm.pd:
        kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"})
        engine += ["--kv-transfer-config", kv]
    servers: list[VllmServer] = []
    router: subprocess.Popen[bytes] | None = None

    def stop() -> None:
        if router is not None and router.poll() is None:
            router.send_signal(signal.SIGTERM)
            try:
                router.wait(10)
            except subprocess.TimeoutExpired:
                router.kill()
                router.wait()
        for server in servers:
            server.stop()

    try:
        for core in (PREFILL_CORE, DECODE_CORE):
            side = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
            own = ALIKE_PREFILL_ARGS if arm.alike and arm.pd and core == PREFILL_CORE else ()
            servers.append(start_vllm_server(log_dir, model, *engine, *own, core=core, served_name=name,
                                             env={**env, **side}))
        for server in servers:
            server.wait_ready(300.0)
        port = free_port()
        urls = [s.url for s in servers]
        layout = (["--vllm-pd-disaggregation", "--prefill", urls[0], "--decode", urls[1], "--policy", "round_robin"]
                  if arm.pd else ["--worker-urls", *urls, "--policy", "cache_aware"])
        cmd = [_router_bin(), *layout, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
        if arm.pd:  # where `up` puts its control plane: the prefill core
            cmd = ["taskset", "-c", str(PREFILL_CORE), *cmd]
        with open(log_dir / f"peers-{index}-{arm.name}-router.log", "wb") as log:
            router = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        _wait_http(url + "/v1/models", router, 120.0)
    except BaseException:
        stop()
        raise
    pids = {"router": router.pid, "prefill" if arm.pd else "engine-0": servers[0].proc.pid,
            "decode" if arm.pd else "engine-1": servers[1].proc.pid}
    return Running(url, pids, stop, {"command": " ".join(cmd), "engine_args": engine,
                                     "engine_env": env,
                                     "start_s": round(time.monotonic() - began, 1)})


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready in {timeout_s}s")
