"""NVIDIA Dynamo's frontend + mocker engines, the peer arm of `python -m bench.peers --suite serving-layer`.

Dynamo is a benchmark dependency, not a product one: it lives in its own venv that this module makes
(``ensure_venv``), never in the project's. ai-dynamo 1.6.1 from PyPI declares ``aisimulate`` (a stub that
downloads its wheel from NVIDIA's own index, unreachable from here) and ``kubernetes``/``redis`` (other
discovery backends); none is imported by ``dynamo.frontend`` or ``dynamo.mocker`` with file discovery, so
ai-dynamo is installed without its declared dependencies and the ones those two modules import are installed
beside it.

Topology (no etcd, no NATS): ``--discovery-backend file`` (workers and the frontend share a directory,
``DYN_FILE_KV``), ``--request-plane tcp``, ``--event-plane zmq``. Two ``python -m dynamo.mocker`` processes
(zero delay: ``--speedup-ratio`` 1e6) and one ``python -m dynamo.frontend`` (its default Rust HTTP server,
preprocessor and tokenizer; ``--router-mode round-robin``, the cheapest policy it has).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.lib.machine import REPO
from cli.ports import free_port

DYNAMO_VERSION = "1.6.1"
VENV = REPO / ".cache" / "bench-venvs" / f"ai-dynamo-{DYNAMO_VERSION}"
# What dynamo.frontend and dynamo.mocker import with file discovery (ai-dynamo's other declared dependencies:
# aisimulate, kubernetes, redis, are not).
RUNTIME_DEPS = ("aiohttp", "certifi", "msgspec", "prometheus-client", "pyzmq", "tqdm", "transformers",
                "typing-extensions", "zstandard")
SPEEDUP_RATIO = "1000000"  # the mocker's timing model divided by this: zero delay in effect


def ensure_venv(venv: Path = VENV) -> Path:
    """The venv's python, made and filled on first use (a few minutes, from PyPI)."""
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if stamp.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, f"ai-dynamo-runtime=={DYNAMO_VERSION}", *RUNTIME_DEPS], check=True)
    subprocess.run([*pip, "--no-deps", f"ai-dynamo=={DYNAMO_VERSION}"], check=True)
    stamp.write_text(DYNAMO_VERSION + "\n")
    return python


@dataclass
class DynamoGraph:
    url: str
    pids: dict[str, int]  # frontend, mocker-0, mocker-1
    procs: list[subprocess.Popen[bytes]]
    store_dir: Path
    commands: list[str] = field(default_factory=list)
    startup_s: float = 0.0
    num_registered: int = 0  # mocker instances seen in the store when it was taken as ready

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.store_dir, ignore_errors=True)


def start_dynamo(python: Path, model: Path, num_workers: int, log_dir: Path, tag: str,
                 ready_timeout_s: float = 180.0, batch: bool = False) -> DynamoGraph:
    """Frontend + ``num_workers`` mockers serving ``model`` (its tokenizer; the weights are not read) under the
    directory's name; returns once a streamed request came back. ``batch``: every process under SCHED_BATCH
    (``chrt -b 0``), as splitserve's `up` runs a mock graph's (cli/cpu_sched.py)."""
    began = time.monotonic()
    store = Path(tempfile.mkdtemp(prefix="dynamo-kv-"))
    env = {**os.environ, "DYN_FILE_KV": str(store), "OMP_NUM_THREADS": "1", "DYN_LOG": "warn"}
    env.pop("PYTHONPATH", None)  # the project's packages stay out of Dynamo's venv
    plane = ["--discovery-backend", "file", "--request-plane", "tcp"]
    name = model.resolve().name
    port = free_port()
    cmds = [[str(python), "-m", "dynamo.mocker", "--model-path", str(model), "--model-name", name,
             "--speedup-ratio", SPEEDUP_RATIO, *plane, "--event-plane", "zmq"] for _ in range(num_workers)]
    cmds.append([str(python), "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
                 *plane, "--router-mode", "round-robin"])
    if batch:
        cmds = [["chrt", "-b", "0", *c] for c in cmds]  # chrt execs the command: same pid
    labels = [f"mocker-{i}" for i in range(num_workers)] + ["frontend"]
    procs: list[subprocess.Popen[bytes]] = []
    graph = DynamoGraph(f"http://127.0.0.1:{port}", {}, procs, store, [" ".join(c) for c in cmds])
    try:
        for label, cmd in zip(labels, cmds):
            with open(log_dir / f"peers-serving-{tag}-{label}.log", "wb") as log:
                procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        graph.pids = {label: p.pid for label, p in zip(labels, procs)}
        _wait_ready(graph, name, num_workers, ready_timeout_s)
    except BaseException:
        graph.stop()
        raise
    graph.startup_s = round(time.monotonic() - began, 2)
    return graph


def _wait_ready(graph: DynamoGraph, name: str, num_workers: int, timeout_s: float,
                grace_s: float = 20.0) -> None:
    """Ready: the model is listed, a request answers, and every mocker registered an instance in the store (or,
    should the store's layout not show them, ``grace_s`` passed since the first answer)."""
    body = (b'{"model": "%s", "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 2}'
            % name.encode())
    deadline = time.monotonic() + timeout_s
    answered_at = None
    while time.monotonic() < deadline:
        if not graph.alive():
            raise RuntimeError(f"a Dynamo process exited: {graph.commands}")
        try:
            with urllib.request.urlopen(graph.url + "/v1/models", timeout=2) as reply:
                listed = name.encode() in reply.read()
            if listed:
                req = urllib.request.Request(graph.url + "/v1/chat/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=5) as reply:
                    if reply.status == 200 and answered_at is None:
                        answered_at = time.monotonic()
        except OSError:
            pass
        graph.num_registered = _registered(graph.store_dir)
        if answered_at is not None and (graph.num_registered >= num_workers
                                        or time.monotonic() - answered_at > grace_s):
            return
        time.sleep(0.5)
    raise RuntimeError(f"Dynamo not ready in {timeout_s}s")


def _registered(store: Path) -> int:
    """Worker instances in the file store (a file each under ``v1/instances/.../generate``)."""
    return sum(1 for p in (store / "v1" / "instances").rglob("*") if p.is_file() and "generate" in str(p))
