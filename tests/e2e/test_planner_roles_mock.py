"""`up --planner --role-switch` on a real graph of processes (mock engines): when prompts queue and the decode
pool has a worker to spare, the planner moves that worker to prefill in place (SetRole through the router)
instead of starting one, and `up` counts it in its new pool (starts and drains nothing)."""

from __future__ import annotations

import asyncio
import json
import random
import threading

import httpx

from tests.harness.graph import list_workers, start_graph, wait_until
from tests.e2e.test_openai_api import MODEL


def roles(router: str) -> list[str]:
    return sorted(w.role for w in asyncio.run(list_workers(router)).workers)


def test_planner_moves_a_spare_decode_worker_to_prefill(tmp_path) -> None:
    decisions = tmp_path / "decisions.jsonl"
    graph = start_graph(tmp_path, "--engine", "mock", "--prefill", "1", "--decode", "2", "--mock-speedup", "2",
                        "--planner", "--role-switch", "--planner-min-dwell-s", "3", "--planner-interval-s", "2",
                        "--planner-window-s", "4", "--planner-slo", "ttft_ms=400,itl_ms=200",
                        "--max-prefill", "2", "--max-decode", "2", "--planner-decisions", str(decisions))
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
            moved = wait_until(lambda: roles(graph.router) == ["decode", "prefill", "prefill"], timeout_s=40,
                               interval_s=0.5)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert moved, graph.logs()[-3000:]
        assert results and set(results) == {200}, f"{len(results)} requests, statuses {set(results)}"
        records = [json.loads(line) for line in decisions.read_text().splitlines()]
        switched = [r for r in records if r.get("role_set")]
        assert switched, "no move the router confirmed"
        first = switched[0]
        assert first["move"]["from_role"] == "decode" and first["move"]["to_role"] == "prefill"
        assert first["role_set"]["ok"] and first["role_set"]["role"] == "prefill"
        assert "prefill_queue" in first["move"]["reasons"] or "ttft" in first["move"]["reasons"]
        logs = graph.logs()
        assert f"worker_id={first['move']['worker_id']}" in logs and "worker_moved" in logs
        # The launcher counted the moved worker in its new pool: nothing started, nothing drained.
        assert "worker_started" not in logs and "worker_draining" not in logs
        assert graph.alive()
    finally:
        graph.stop()
