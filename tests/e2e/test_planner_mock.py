"""Scaling on a real graph of processes (mock engines): a SIGTERM drains a worker without losing a request,
and `up --planner` adds a prefill worker when prompts queue, then drains it when the load is gone."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import threading

import httpx
import pytest

from tests.harness.graph import Graph, child_pid, start_graph, wait_until, worker_stats
from tests.harness.graph import list_workers as graph_list_workers
from common.protocol import WorkerList
from tests.e2e.test_faults_mock import stream_in_background
from tests.e2e.test_openai_api import MODEL


def list_workers(router: str) -> WorkerList:
    return asyncio.run(graph_list_workers(router))


def metric(graph: Graph, name: str) -> float:
    text = httpx.get(f"{graph.url}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")
               or line.startswith(name + "{"))


@pytest.fixture()
def pd2(tmp_path) -> Graph:
    graph = start_graph(tmp_path, "--engine", "mock", "--prefill", "1", "--decode", "2", "--num-blocks", "512",
                        "--router-policy", "round-robin")
    yield graph
    graph.stop()


def test_sigterm_drains_a_decode_worker_without_losing_a_request(pd2: Graph) -> None:
    streams = [stream_in_background(pd2, [300 + 17 * i + k for k in range(40)], max_tokens=120, seed=i)
               for i in range(4)]
    assert wait_until(lambda: all(len(chunks) > 5 for chunks, _, _ in streams), timeout_s=15)
    busy = [w for w, s in worker_stats(pd2.router).items() if w.startswith("decode") and s.load.num_running]
    assert busy, "no decode worker is streaming"
    pid = child_pid(pd2, f"--worker-id {busy[0]}")
    os.kill(pid, signal.SIGTERM)
    assert wait_until(lambda: busy[0] in list_workers(pd2.router).draining, timeout_s=3)
    # New requests while it drains go to the other decode worker and succeed.
    with httpx.Client(base_url=pd2.url, timeout=30) as http:
        for i in range(4):
            r = http.post("/v1/completions", json={"model": MODEL, "prompt": [900 + i] * 20, "max_tokens": 5})
            assert r.status_code == 200, r.text
    for chunks, done, thread in streams:
        assert done.wait(30), "a stream never finished"
        thread.join()
    # Every stream got all its tokens from the worker it started on: drained, not migrated.
    assert metric(pd2, "splitserve_frontend_migrations_total") == 0
    assert wait_until(lambda: busy[0] not in [w.worker_id for w in list_workers(pd2.router).workers], timeout_s=10)
    logs = pd2.logs()
    assert f"worker_id={busy[0]}" in logs and "drained" in logs
    assert pd2.alive()


def test_planner_adds_prefill_when_prompts_queue_then_drains_it(tmp_path) -> None:
    decisions = tmp_path / "decisions.jsonl"
    graph = start_graph(tmp_path, "--engine", "mock", "--prefill", "1", "--decode", "1", "--mock-speedup", "2",
                        "--planner", "--planner-interval-s", "1", "--planner-window-s", "3", "--planner-slo", "ttft_ms=400,itl_ms=200",
                        "--max-prefill", "2", "--max-decode", "1", "--planner-decisions", str(decisions))
    try:
        stop = threading.Event()
        results: list[int] = []

        def load(i: int) -> None:
            rng = random.Random(i)
            with httpx.Client(base_url=graph.url, timeout=60) as http:
                while not stop.is_set():
                    # Unique 2,000-token prompts: ~0.5 s of prefill each (mock, speedup 2), no cache hits.
                    prompt = [rng.randrange(100, 8000) for _ in range(2000)]
                    r = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4})
                    results.append(r.status_code)

        threads = [threading.Thread(target=load, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        try:
            scaled = wait_until(lambda: sum(w.role == "prefill" for w in list_workers(graph.router).workers) == 2,
                                timeout_s=40, interval_s=0.5)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert scaled, graph.logs()[-3000:]
        # Idle: three quiet intervals, then the added worker drains and leaves.
        assert wait_until(lambda: sum(w.role == "prefill" for w in list_workers(graph.router).workers) == 1,
                          timeout_s=30, interval_s=0.5), graph.logs()[-3000:]
        assert results and set(results) == {200}, f"{len(results)} requests, statuses {set(results)}"
        records = [json.loads(line) for line in decisions.read_text().splitlines()]
        ups = [r for r in records if r["requests"][0]["target"] > r["requests"][0]["current"]]
        assert ups and "prefill_queue" in ups[0]["requests"][0]["reason"]
        # Decode was never the short pool here.
        assert all(r["requests"][1]["target"] == 1 for r in records)
        assert wait_until(lambda: "worker_drained" in graph.logs(), timeout_s=5)  # exit 0, not restarted
    finally:
        graph.stop()
