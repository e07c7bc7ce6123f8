"""`up --engine mock --mock-nixl`: two real mock worker processes move each prompt's KV bytes with real NIXL (the
decode worker READs the prefill worker's registered region and checks every block), report real transfers, and
the router learns the link from them."""

from __future__ import annotations

import importlib.util
import re
import urllib.request
from collections.abc import Iterator

import pytest

from cli.ports import free_port
from tests.e2e.test_openai_api import MODEL, client
from tests.harness.graph import Graph, start_graph, wait_until, worker_stats

BLOCK_SIZE = 32
BLOCK_BYTES = 16384  # small, so the test moves MBs, not GBs
NUM_BLOCKS = 256


@pytest.fixture(scope="module")
def nixl_pd(tmp_path_factory) -> Iterator[tuple[Graph, int]]:
    if importlib.util.find_spec("nixl") is None:
        pytest.skip("nixl is not installed (make setup installs it)")
    metrics_port = free_port()
    graph = start_graph(tmp_path_factory.mktemp("mocknixl"), "--engine", "mock", "--prefill", "1", "--decode", "1",
                        "--mock-speedup", "10", "--num-blocks", str(NUM_BLOCKS), "--router-policy", "round-robin",
                        "--mock-nixl", "--mock-block-bytes", str(BLOCK_BYTES), "--no-kvtier",
                        "--router-metrics-port", str(metrics_port))
    yield graph, metrics_port
    graph.stop()


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as resp:
        text = resp.read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_prompts_kv_bytes_move_over_nixl_checked_and_teach_the_router(nixl_pd: tuple[Graph, int]) -> None:
    graph, router_metrics_port = nixl_pd
    lengths = (700, 1000, 333, 600)  # above the local-prefill threshold (256); 333: a partial last block
    for i, n in enumerate(lengths):
        out = client(graph).completions.create(model=MODEL, prompt=[4000 + 997 * i + j for j in range(n)],
                                               max_tokens=8, seed=i, extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 8
    stats = worker_stats(graph.router)
    decode_id, prefill_id = "decode-1", "prefill-0"
    decode = stats[decode_id]
    # Every prompt's whole KV, block by block (partial last blocks move whole), checked on arrival: none failed.
    assert [(t.num_bytes, t.src_worker_id, t.simulated) for t in decode.recent_transfers] == [
        (-(-n // BLOCK_SIZE) * BLOCK_BYTES, prefill_id, False) for n in lengths]
    assert decode.num_transfer_failures == 0 and not decode.transfers_simulated
    assert all(t.seconds > 0 and t.num_descriptors >= 1 for t in decode.recent_transfers)
    # The prefill worker held each prompt's blocks until the READ's notification: all free again.
    assert wait_until(lambda: all(s.load.num_free_blocks == s.load.num_total_blocks
                                  for s in worker_stats(graph.router).values()), timeout_s=10)
    # Real samples reach the router, which learns from them (none counted as simulated).
    assert wait_until(lambda: _metric(router_metrics_port, "splitserve_router_transfer_samples_total")
                      >= len(lengths), timeout_s=10)
    assert _metric(router_metrics_port, 'splitserve_router_simulated_samples_total{kind="transfer"}') == 0
