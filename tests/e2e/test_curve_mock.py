"""A whole local graph with CURVE on every socket (`up --curve-dir`, the keys from `keys make`): a chat request
streams through frontend, router, prefill and decode workers (kvtier on), and worker processes without an allowed
key (none at all, or another cluster's key that knows our servers' public keys) never register, while the graph
keeps serving."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.graph import Graph, list_workers, start_graph, tiny_model_dir
from bench.lib.machine import REPO
from common.security import load_curve_keys, make_curve_keys
from common.transport import TransportConfig
from tests.e2e.test_openai_api import MODEL, client


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    return make_curve_keys(tmp_path_factory.mktemp("curve") / "keys")


@pytest.fixture(scope="module")
def graph(tmp_path_factory, keys: Path) -> Graph:
    g = start_graph(tmp_path_factory.mktemp("curve-graph"), "--engine", "mock", "--prefill", "1", "--decode", "1",
                    "--mock-speedup", "10", "--num-blocks", "512", "--router-policy", "round-robin",
                    "--curve-dir", str(keys))
    yield g
    g.stop()


def _chat_streams(graph: Graph) -> str:
    chunks = list(client(graph).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello " * 400}], max_tokens=12, stream=True,
        extra_body={"ignore_eos": True}))
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["length"]
    return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def test_request_streams_through_a_curve_graph(graph: Graph) -> None:
    assert _chat_streams(graph)
    assert "--curve-dir" in " ".join(graph.cmd)


def test_workers_without_an_allowed_key_cannot_register(graph: Graph, keys: Path, tmp_path: Path) -> None:
    theirs = make_curve_keys(tmp_path / "theirs")
    outsider = tmp_path / "outsider"  # another cluster's worker key, told our servers' public keys
    shutil.copytree(theirs / "worker", outsider)
    for server in ("router", "kvtier"):
        shutil.copy(keys / "worker" / "servers" / f"{server}.key", outsider / "servers" / f"{server}.key")
    env = {k: v for k, v in os.environ.items() if k != "SPLITSERVE_CURVE_DIR"} | {"OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "cli.main", "worker", "--model", str(tiny_model_dir()), "--engine", "mock",
            "--role", "both", "--router", graph.router, "--num-blocks", "64"]
    logs, procs = {}, {}
    for name, extra in (("intruder-plain", []), ("intruder-keyed", ["--curve-dir", str(outsider)])):
        logs[name] = tmp_path / f"{name}.log"
        with open(logs[name], "wb") as out:
            procs[name] = subprocess.Popen([*base, "--worker-id", name, *extra], cwd=REPO, env=env, stdout=out,
                                           stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not all("router_unreachable" in logs[n].read_text(errors="replace") for n in procs):
            assert all(p.poll() is None for p in procs.values()), {n: logs[n].read_text()[-2000:] for n in logs}
            assert time.monotonic() < deadline, {n: logs[n].read_text()[-2000:] for n in logs}
            time.sleep(0.5)
        time.sleep(3.0)  # a few more registration attempts each
        frontend = TransportConfig(curve=load_curve_keys(keys / "frontend")).toward("router")
        registered = {w.worker_id for w in asyncio.run(list_workers(graph.router, frontend)).workers}
        assert registered == {"prefill-0", "decode-1"}
        assert _chat_streams(graph)  # still serving
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
