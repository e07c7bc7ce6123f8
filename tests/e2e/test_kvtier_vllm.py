"""kvtier behind real vLLM engines (our KV connector), through the HTTP API: fp32, greedy, the tiny model.

Two aggregated vLLM workers (round-robin, each pinned to its own core by the launcher) with 24 usable KV blocks
each (25 minus vLLM's null block) and one kvtier: a small host pool (65 slots of one 128 KiB block) over a disk
tier. The prefix P is computed once (the reference output), evicted from the engines by long fillers, then served
from kvtier's host pool on the worker that evicted it and on the one that never had it, then from disk, then with
one disk block corrupted on purpose, and after kvtier is killed and restarted: every output equals the first,
fresh one.
"""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

import pytest

from tests.harness.graph import Graph, child_pid, start_graph, wait_until
from tests.e2e.test_kvtier_mock import _settled, _tier_up, tier_stats
from tests.e2e.test_openai_api import MODEL, client

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]
BLOCK = 32
BLOCK_BYTES = 4096 * BLOCK  # tiny model, fp32: 4 layers x K,V x 2 heads x 64 dims x 4 bytes per token
PREFIX = [200 + i for i in range(8 * BLOCK + 5)]  # 8 full blocks
# 23 full blocks each (+ 8 generated tokens: 24 blocks): one filler evicts everything else from an engine.
FILLERS = [[1000 + 37 * k + 3 * i for i in range(23 * BLOCK + 3)] for k in range(11)]
HOST_SLOTS = 65  # 8 MiB / 128 KiB, rounded down by kvtier (0.008 GiB)


@pytest.fixture(scope="module")
def tier_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kvtier-disk")


@pytest.fixture(scope="module")
def graph(tmp_path_factory, tier_dir: Path) -> Graph:
    g = start_graph(tmp_path_factory.mktemp("kvtier-vllm"), "--engine", "vllm", "--dtype", "float32",
                    "--aggregated", "2", "--num-blocks", "25", "--router-policy", "round-robin",
                    "--host-cache-gb", "0.008", "--disk-cache-gb", "0.01", "--disk-cache-dir", str(tier_dir))
    assert wait_until(lambda: _tier_up(g), timeout_s=20), g.logs()[-3000:]
    yield g
    g.stop()


def complete(graph: Graph, prompt: list[int]) -> tuple[str, int]:
    out = client(graph).completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True})
    return out.choices[0].text, out.usage.prompt_tokens_details.cached_tokens


@pytest.fixture(scope="module")
def reference(graph: Graph) -> str:
    """P's output computed from scratch (worker A), then one filler per worker evicts P from both engines."""
    text, cached = complete(graph, PREFIX)
    assert cached == 0
    for filler in FILLERS[:2]:
        assert complete(graph, filler)[1] == 0
    _settled(graph)
    return text


def test_prefix_onboarded_from_host_on_both_workers(graph: Graph, reference: str) -> None:
    stats = tier_stats(graph)
    assert stats.block_bytes == BLOCK_BYTES and stats.host_slots == HOST_SLOTS
    assert stats.blocks_stored == 8 + 2 * 23 and stats.hits_host == 0
    # Worker A evicted P; worker B never computed it (A wrote it through): both load all 8 blocks from host.
    assert complete(graph, PREFIX) == (reference, 8 * BLOCK)
    assert complete(graph, PREFIX) == (reference, 8 * BLOCK)
    stats = tier_stats(graph)
    assert stats.hits_host == 16 and stats.bytes_out == 16 * BLOCK_BYTES and stats.checksum_failures == 0


def test_prefix_onboarded_from_disk_then_corrupt_block_recomputed(graph: Graph, reference: str,
                                                                  tier_dir: Path) -> None:
    # 3 more fillers (69 blocks) turn the host pool over: P (looked up, so worth keeping) moves to disk, the
    # fillers' blocks (never looked up) are dropped. Both engines evict P again.
    for filler in FILLERS[2:5]:
        complete(graph, filler)
    _settled(graph)
    stats = tier_stats(graph)
    assert stats.demotions == 8 and stats.disk_used == 8
    before = stats.hits_disk
    assert complete(graph, PREFIX) == (reference, 8 * BLOCK)  # worker A: from disk
    assert tier_stats(graph).hits_disk == before + 8
    # P went to disk slots 0-7 in chain order (LRU order = chain order). Corrupt block 4's bytes: kvtier's
    # checksum catches it, serves blocks 0-3, and worker B (P evicted) recomputes blocks 4-7.
    slab = tier_dir / "kvtier-kvtier-0.slab"
    with open(slab, "r+b") as f:
        f.seek(4 * BLOCK_BYTES + 1000)
        f.write(b"\xff" * 64)
    text, _ = complete(graph, PREFIX)
    assert text == reference
    stats = tier_stats(graph)
    assert stats.checksum_failures == 1 and stats.disk_used == 7
    assert "kvtier_load_incomplete" in graph.logs()


def test_killed_kvtier_costs_recomputes_then_its_restart_serves_again(graph: Graph, reference: str) -> None:
    connects_before = graph.logs().count("kvtier_nixl_connected")
    os.kill(child_pid(graph, " kvtier "), signal.SIGKILL)
    complete(graph, FILLERS[5])  # A
    complete(graph, FILLERS[6])  # B
    assert complete(graph, PREFIX) == (reference, 0)  # A: P evicted, kvtier gone: recomputed
    # The launcher restarts kvtier: empty, with another NIXL agent.
    assert wait_until(lambda: _tier_up(graph) and tier_stats(graph).nixl, timeout_s=30), graph.logs()[-3000:]
    complete(graph, FILLERS[7])  # B
    complete(graph, FILLERS[8])  # A
    # B: from the new kvtier if A's write-through of P reached it (it restarts in about a second), else
    # recomputed and written through by B.
    assert complete(graph, PREFIX)[0] == reference
    _settled(graph)
    complete(graph, FILLERS[9])  # A
    complete(graph, FILLERS[10])  # B
    # A's NIXL view of kvtier was the dead process's pool: it learns the new one and READs P from it.
    assert complete(graph, PREFIX) == (reference, 8 * BLOCK)
    stats = tier_stats(graph)
    assert stats.hits_host >= 8 and stats.checksum_failures == 0
    assert graph.logs().count("kvtier_nixl_connected") > connects_before
