"""A kvtier that stalls (SIGSTOP: its port still accepts, nothing answers) costs recomputes, never a failed
request."""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.harness.graph import Graph, child_pid, start_graph
from tests.e2e.test_openai_api import MODEL, client


@pytest.fixture()
def agg_kvtier(tmp_path) -> Graph:
    # 64 blocks of 32 tokens: three 640-token prompts evict each other, so repeats look kvtier up.
    graph = start_graph(tmp_path, "--engine", "mock", "--aggregated", "1", "--mock-speedup", "10",
                        "--num-blocks", "64")
    yield graph
    graph.stop()


def test_stalled_kvtier_costs_recomputes_not_errors(agg_kvtier: Graph) -> None:
    prompts = [[300 + 800 * p + i for i in range(640)] for p in range(6)]
    for prompt in prompts:  # offloaded as they evict each other
        client(agg_kvtier).completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    kvtier = child_pid(agg_kvtier, "cli.main kvtier")
    os.kill(kvtier, signal.SIGSTOP)
    try:
        def one(i: int) -> int:
            out = client(agg_kvtier).completions.create(model=MODEL, prompt=prompts[i % 6] + [7, i], max_tokens=4)
            return out.usage.completion_tokens

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(one, range(24))) == [4] * 24
    finally:
        os.kill(kvtier, signal.SIGCONT)
    logs = agg_kvtier.logs()
    assert "kvtier_unavailable" in logs  # the worker did hit the stalled tier and fell back
    assert "internal_error" not in logs
