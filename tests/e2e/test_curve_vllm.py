"""The vLLM KV connector's kvtier client under CURVE, on the real path: `up --curve-dir` with a vLLM worker (fp32,
the tiny model) and kvtier. The connector inside vLLM's engine processes loads the worker's keys from the path in
its extra config and writes a prompt's blocks through to kvtier, which accepts only allowed keys: a client with
the worker's key reads kvtier's stats, an unkeyed one gets nothing, and kvtier keeps serving."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.harness.graph import Graph, start_graph, wait_until
from common.kvtier.client import TierClientConfig
from common.kvtier.sync_client import SyncTierClient
from common.security import load_curve_keys, make_curve_keys
from tests.e2e.test_kvtier_mock import _kvtier_endpoint
from tests.e2e.test_openai_api import MODEL, client

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]
BLOCK = 32
PROMPT = [200 + i for i in range(8 * BLOCK + 5)]  # 8 full blocks


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    return make_curve_keys(tmp_path_factory.mktemp("curve") / "keys")


@pytest.fixture(scope="module")
def graph(tmp_path_factory, keys: Path) -> Graph:
    g = start_graph(tmp_path_factory.mktemp("curve-vllm"), "--engine", "vllm", "--dtype", "float32",
                    "--aggregated", "1", "--num-blocks", "25", "--host-cache-gb", "0.008", "--curve-dir", str(keys))
    yield g
    g.stop()


def test_vllm_connector_writes_through_to_a_curve_kvtier(graph: Graph, keys: Path) -> None:
    endpoint = _kvtier_endpoint(graph)
    keyed = SyncTierClient(TierClientConfig(endpoint=endpoint, curve=load_curve_keys(keys / "worker")))
    plain = SyncTierClient(TierClientConfig(endpoint=endpoint))
    try:
        out = client(graph).completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                               extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 4
        # The connector's write-through (its own CURVE client, inside vLLM's engine process) reached kvtier.
        assert wait_until(lambda: (s := keyed.stats(timeout_s=1.0)) is not None and s.blocks_stored >= 8,
                          timeout_s=20), graph.logs()[-3000:]
        assert plain.stats(timeout_s=1.0) is None  # no key: no handshake, no answer
        assert keyed.stats(timeout_s=1.0) is not None  # still serving
    finally:
        keyed.close()
        plain.close()
