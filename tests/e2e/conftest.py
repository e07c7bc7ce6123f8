from __future__ import annotations

import pytest

from tests.harness.graph import Graph, start_graph
from cli.ports import free_port


@pytest.fixture(scope="session")
def mock_pd(tmp_path_factory) -> Graph:
    """1 prefill + 1 decode mock worker, 10x faster than the modelled ~100M engine."""
    graph = start_graph(tmp_path_factory.mktemp("pd"), "--engine", "mock", "--prefill", "1", "--decode", "1",
                        "--mock-speedup", "10", "--num-blocks", "512", "--router-policy", "round-robin")
    yield graph
    graph.stop()


@pytest.fixture(scope="session")
def mock_pd_kv(tmp_path_factory) -> tuple[Graph, int]:
    """1 prefill + 1 decode mock worker behind the kv router (prefill placed in seconds); with the router's
    metrics port."""
    metrics_port = free_port()
    graph = start_graph(tmp_path_factory.mktemp("pdkv"), "--engine", "mock", "--prefill", "1", "--decode", "1",
                        "--mock-speedup", "10", "--num-blocks", "512", "--router-policy", "kv",
                        "--router-metrics-port", str(metrics_port))
    yield graph, metrics_port
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
                        "--mock-speedup", "10", "--num-blocks", "512", "--router-policy", "kv",
                        "--router-metrics-port", str(free_port()))
    yield graph
    graph.stop()
