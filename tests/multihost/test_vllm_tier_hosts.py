"""Real vLLM and kvtier across hosts: a prefix computed on B, evicted, served to another host from B's tier.

Frontend + router on A; on B a kvtier and an aggregated vLLM worker writing through to it; on C (the issue's
"D") an aggregated vLLM worker with no kvtier of its own, whose ``--kvtier`` is B's. The prefix P is computed
on B (the reference output; B's write-through stores its blocks in B's tier), evicted from B's engine by a
filler, then asked again and routed to C: C's engine never had it, so C's kvtier connector READs it from B's
tier with NIXL over the bridge (separate PID and IPC namespaces: UCX must take TCP) and checks every block's
checksum. fp32, greedy: the output equals the fresh one token for token.
"""

from __future__ import annotations

import importlib.util
import re
import time
from dataclasses import dataclass

import pytest

from tests.harness.graph import tiny_model_dir, wait_until
from common.protocol import TierStats, WorkerStats
from tests.multihost.cluster import Cluster
from tests.multihost.test_vllm_hosts import kv_bytes_per_block, nixl_args

pytestmark = [pytest.mark.multihost, pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")]
MODEL = "tiny"
BLOCK = 32
BLOCK_BYTES = kv_bytes_per_block(tiny_model_dir(), BLOCK)  # fp32: 4 layers x K,V x 2 heads x 64 x 4 B x 32
PREFIX = [200 + i for i in range(8 * BLOCK + 5)]  # 8 full blocks
# 23 full blocks each (+ 8 generated tokens: 24 blocks, all an engine of 25 has): one evicts everything else.
FILLERS = [[1000 + 37 * k + 3 * i for i in range(23 * BLOCK + 3)] for k in range(2)]
# Slots of one block: P and both fillers (54 blocks) stay in the host pool.
HOST_CACHE_GB = 0.02
VLLM = ("--engine", "vllm", "--dtype", "float32", "--block-size", str(BLOCK), "--num-blocks", "25")
READY_TIMEOUT_S = 300.0  # two engines starting at once on a busy 2-core machine


@dataclass
class Run:
    reference: tuple[str, int]  # P on B, fresh: (text, cached tokens)
    served: tuple[str, int]  # P on C, from B's tier
    tier_before: TierStats  # B's tier once the write-throughs settled, before P was asked on C
    tier_after: TierStats
    stats: dict[str, WorkerStats]
    rx_bytes: int  # received on C's link while C served P
    log_c: str


def complete(cl: Cluster, tokens: list[int]) -> tuple[str, int]:
    out = cl.client(timeout_s=300).completions.create(model=MODEL, prompt=tokens, max_tokens=8, temperature=0,
                                                      extra_body={"ignore_eos": True})
    return out.choices[0].text, out.usage.prompt_tokens_details.cached_tokens


def settled(cl: Cluster, host) -> TierStats:
    """Write-throughs are asynchronous: B's tier once its stored count stops moving."""
    last = cl.tier_stats(host)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = cl.tier_stats(host)
        if now.blocks_stored == last.blocks_stored:
            return now
        last = now
    return last


@pytest.fixture(scope="module")
def tier_run(make_module_hosts, tmp_path_factory) -> Run:
    hs = make_module_hosts(3)
    a, b, c = hs
    cl = Cluster(hs, tmp_path_factory.mktemp("vllm-tier-hosts"), tiny_model_dir())
    try:
        # Round-robin over the workers sorted by id: requests go to both-b, both-c, both-b, both-c.
        cl.router(a, "--policy", "round-robin")
        cl.frontend(a)
        cl.kvtier(b, "kvtier-b", "--host-cache-gb", str(HOST_CACHE_GB), "--block-bytes", str(BLOCK_BYTES))
        tier = cl.kvtier_endpoint(b)
        cl.worker(b, "both", "both-b", *VLLM, *nixl_args(b), "--kvtier", tier, "--core", "0")
        cl.worker(c, "both", "both-c", *VLLM, *nixl_args(c), "--kvtier", tier, "--core", "1")
        cl.wait_ready(num_prefill=0, num_decode=2, timeout_s=READY_TIMEOUT_S)
        assert wait_until(lambda: cl.tier_stats(b).nixl, timeout_s=30), cl.logs()
        reference = complete(cl, PREFIX)  # B
        complete(cl, FILLERS[0])  # C
        complete(cl, FILLERS[1])  # B: P evicted from B's engine
        tier_before = settled(cl, b)
        rx_before = c.link_bytes()[0]
        served = complete(cl, PREFIX)  # C
        rx_bytes = c.link_bytes()[0] - rx_before
        return Run(reference, served, tier_before, settled(cl, b), cl.stats(), rx_bytes,
                   cl.service("both-c").proc.logs())
    except Exception:
        print(cl.logs())
        raise
    finally:
        cl.stop(timeout_s=30)


def test_prefix_computed_on_b_is_served_to_c_from_bs_tier(tier_run: Run) -> None:
    assert tier_run.reference[1] == 0  # computed fresh on B
    assert tier_run.served == (tier_run.reference[0], 8 * BLOCK)  # same text, every full block from the tier
    before, after = tier_run.tier_before, tier_run.tier_after
    # B wrote P and its filler through, C its filler: all held, nothing evicted from the tier yet.
    assert before.blocks_stored == 8 + 2 * 23 and before.evictions_host == 0 and before.hits_host == 0
    assert after.hits_host - before.hits_host == 8
    assert after.bytes_out - before.bytes_out == 8 * BLOCK_BYTES
    assert after.checksum_failures == 0
    # C pulled P's blocks (its scheduler counts them), computed only the partial last block.
    c, b = tier_run.stats["both-c"], tier_run.stats["both-b"]
    assert c.num_prompt_tokens_pulled == 8 * BLOCK
    assert b.num_prompt_tokens_pulled == 0 and b.num_prompt_tokens_computed >= len(PREFIX) + len(FILLERS[1])


def test_cs_load_was_a_nixl_read_over_its_link(tier_run: Run) -> None:
    loads = [line for line in tier_run.log_c.splitlines() if "kvtier_loaded" in line]
    print(f"C's tier loads: {loads}; rx on C while served: {tier_run.rx_bytes} B")
    assert len(loads) == 1
    assert re.search(r"via=nixl\b", loads[0]) and re.search(r"num_blocks=8\b", loads[0]), loads[0]
    assert re.search(r"num_read=8\b", loads[0]), loads[0]  # READ from B's pool, none inline
    assert "kvtier_nixl_connected" in tier_run.log_c
    # The blocks crossed C's link: no shared memory between the hosts.
    assert tier_run.rx_bytes >= 8 * BLOCK_BYTES
