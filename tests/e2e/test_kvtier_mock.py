"""kvtier on a real graph: 2 aggregated mock workers (round-robin) with tiny KV pools and a shared kvtier.

A prefix evicted from one worker's engine comes back from kvtier as cached tokens, on that worker and on the
other one, and the router learns the host tier's speed from those loads; killing kvtier (kill -9) loses no
request, it only costs recomputes.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from tests.harness.graph import Graph, child_pid, start_graph, wait_until, worker_stats
from cli.ports import free_port
from common.protocol import GetStats, TierStats
from common.transport import Client, new_id
from services.router.tier_credit import TierConfig
from tests.e2e.test_openai_api import MODEL, client

BLOCK = 32
PREFIX = [200 + i for i in range(8 * BLOCK + 5)]  # 8 full blocks
FILLERS = [[1000 + 500 * k + i for i in range(8 * BLOCK + 5)] for k in range(6)]


@pytest.fixture(scope="module")
def kvtier_graph(tmp_path_factory) -> Graph:
    graph = start_graph(tmp_path_factory.mktemp("kvtier"), "--engine", "mock", "--aggregated", "2",
                        "--mock-speedup", "10", "--num-blocks", "24", "--router-policy", "round-robin",
                        "--host-cache-gb", "0.25", "--router-metrics-port", str(free_port()))
    assert wait_until(lambda: _tier_up(graph), timeout_s=20), graph.logs()[-3000:]
    yield graph
    graph.stop()


def _kvtier_endpoint(graph: Graph) -> str:
    pid = child_pid(graph, " kvtier ")
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return args[args.index("--endpoint") + 1]


def tier_stats(graph: Graph, timeout_s: float = 5.0) -> TierStats:
    async def ask() -> TierStats:
        ctx = zmq.asyncio.Context()
        c = Client(ctx, _kvtier_endpoint(graph))
        try:
            reply = await c.request(GetStats(request_id=new_id("t")), timeout_s)
            assert isinstance(reply, TierStats)
            return reply
        finally:
            await c.close()
            ctx.term()

    return asyncio.run(ask())


def _complete(graph: Graph, prompt: list[int]) -> int:
    out = client(graph).completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert out.choices[0].finish_reason == "length"
    return out.usage.prompt_tokens_details.cached_tokens


def _settled(graph: Graph) -> None:
    """Offloads are asynchronous: wait until kvtier's stored count stops moving."""
    last = -1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = tier_stats(graph).blocks_stored
        if now == last:
            return
        last = now
        time.sleep(0.3)


def test_evicted_prefix_is_onboarded_on_both_workers(kvtier_graph: Graph) -> None:
    assert _complete(kvtier_graph, PREFIX) == 0  # worker 0 computes it
    for filler in FILLERS:  # 3 per worker: 24-block pools, 9 blocks each: the prefix is evicted from worker 0
        assert _complete(kvtier_graph, filler) == 0
    _settled(kvtier_graph)
    stats = tier_stats(kvtier_graph)
    assert stats.blocks_stored >= 8 and stats.hits_host == 0
    # The next two requests land on one worker each: both get the prefix from kvtier (one evicted it, the
    # other never had it).
    assert _complete(kvtier_graph, PREFIX) == 8 * BLOCK
    assert _complete(kvtier_graph, PREFIX) == 8 * BLOCK
    assert all(s.num_prefix_hits >= 1 for s in worker_stats(kvtier_graph.router).values())
    stats = tier_stats(kvtier_graph)
    assert stats.hits_host >= 8 and stats.bytes_out >= 8 * 36864 * BLOCK
    assert stats.checksum_failures == 0


def router_metric(graph: Graph, name: str, labels: str) -> float:
    port = graph.cmd[graph.cmd.index("--router-metrics-port") + 1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as resp:
        text = resp.read().decode()
    match = re.search(rf"^{re.escape(name)}{{{re.escape(labels)}}} (\S+)$", text, re.M)
    assert match is not None, name
    return float(match.group(1))


def test_router_learns_no_tier_speed_from_mock_loads(kvtier_graph: Graph) -> None:
    """The two onboards above reach the router with the workers' heartbeats (after the first test), marked
    simulated (the mock engine made the move up): the router counts them apart and both tiers keep their seed."""
    bandwidth = "splitserve_router_tier_bytes_per_second"
    assert wait_until(lambda: _simulated_tier_loads(kvtier_graph) >= 2, timeout_s=5)
    assert router_metric(kvtier_graph, bandwidth, 'tier="host"') == TierConfig().host_bytes_per_s
    assert router_metric(kvtier_graph, bandwidth, 'tier="disk"') == TierConfig().disk_bytes_per_s


def _simulated_tier_loads(graph: Graph) -> float:
    try:
        return router_metric(graph, "splitserve_router_simulated_samples_total", 'kind="tier_load"')
    except AssertionError:  # no series until the first one arrives
        return 0.0


def test_killed_kvtier_loses_no_request(kvtier_graph: Graph) -> None:
    os.kill(child_pid(kvtier_graph, " kvtier "), signal.SIGKILL)
    prompts = [PREFIX] + [[4500 + 300 * k + i for i in range(4 * BLOCK)] for k in range(4)] + [PREFIX]
    for prompt in prompts:
        _complete(kvtier_graph, prompt)  # every one completes (a recompute at worst)
    assert kvtier_graph.alive()
    # The launcher restarts kvtier; workers reconnect to it after their backoff.
    assert wait_until(lambda: _tier_up(kvtier_graph), timeout_s=10)


def _tier_up(graph: Graph) -> bool:
    try:
        return tier_stats(graph, timeout_s=0.5).host_slots > 0
    except Exception:
        return False
