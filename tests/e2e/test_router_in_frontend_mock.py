"""`up --router-in-frontend` on a real mock graph: the frontend routes through the router replica it hosts (no
router process), prefixes go where they live, and a killed frontend comes back with its replica."""

from __future__ import annotations

import os
import signal
import urllib.request

import pytest

from tests.e2e.test_openai_api import MODEL
from tests.e2e.test_replicas_mock import _client, _reuse
from tests.harness.graph import Graph, child_pid, children, start_graph, wait_until, worker_ids


@pytest.fixture(scope="module")
def hosted(tmp_path_factory) -> Graph:
    graph = start_graph(tmp_path_factory.mktemp("router-in-frontend"), "--engine", "mock", "--aggregated", "3",
                        "--mock-speedup", "10", "--num-blocks", "512", "--no-kvtier", "--router-in-frontend")
    yield graph
    graph.stop()


def test_no_router_process_and_workers_register_with_the_frontends_replica(hosted: Graph) -> None:
    commands = [" ".join(args) for args in children(hosted.proc.pid).values()]
    assert not [c for c in commands if "cli.main router" in c]
    assert [c for c in commands if "cli.main frontend" in c and "--router-inside" in c]
    # The graph's router endpoint is the replica's, bound inside the frontend process.
    assert wait_until(lambda: worker_ids(hosted.router) == {"both-0", "both-1", "both-2"}, timeout_s=10)


def test_prefixes_are_routed_where_they_live(hosted: Graph) -> None:
    prefixes = [[1000 + 500 * p + i for i in range(320)] for p in range(6)]  # 10 full blocks each
    _reuse(hosted, prefixes, 6, salt=0)  # each prefix computed once somewhere
    assert _reuse(hosted, prefixes, 36, salt=1) > 0.8  # KV events reach the replica; its routes follow them


def test_a_killed_frontend_comes_back_with_its_replica(hosted: Graph) -> None:
    pid = child_pid(hosted, "--router-inside")
    os.kill(pid, signal.SIGKILL)

    def restarted() -> bool:
        try:
            return child_pid(hosted, "--router-inside") != pid
        except LookupError:  # not started again yet
            return False

    def serving() -> bool:
        try:
            with urllib.request.urlopen(hosted.url + "/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    assert wait_until(lambda: restarted() and serving(), timeout_s=60)
    # The workers registered again with the new replica (their heartbeats were refused), and it routes.
    assert wait_until(lambda: len(worker_ids(hosted.router)) == 3, timeout_s=20)
    out = _client(hosted).completions.create(model=MODEL, prompt=[5, 6, 7, 8], max_tokens=4)
    assert out.choices[0].finish_reason == "length"
