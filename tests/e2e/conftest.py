from __future__ import annotations

import pytest

from bench.lib.graph import Graph, start_graph


@pytest.fixture(scope="session")
def mock_pd(tmp_path_factory) -> Graph:
    """1 prefill + 1 decode mock worker, 10x faster than the modelled ~100M engine."""
    graph = start_graph(tmp_path_factory.mktemp("pd"), "--engine", "mock", "--prefill", "1", "--decode", "1",
                        "--mock-speedup", "10", "--num-blocks", "512", "--router-policy", "round-robin")
    yield graph
    graph.stop()


@pytest.fixture(scope="session")
def mock_agg(tmp_path_factory) -> Graph:
    graph = start_graph(tmp_path_factory.mktemp("agg"), "--engine", "mock", "--aggregated", "1",
                        "--mock-speedup", "10", "--num-blocks", "512")
    yield graph
    graph.stop()


@pytest.fixture(scope="session")
def mock_kv2(tmp_path_factory) -> Graph:
    """2 aggregated mock workers behind the KV-aware router."""
    graph = start_graph(tmp_path_factory.mktemp("kv2"), "--engine", "mock", "--aggregated", "2",
                        "--mock-speedup", "10", "--num-blocks", "512", "--router-policy", "kv")
    yield graph
    graph.stop()
