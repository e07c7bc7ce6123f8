"""Real vLLM, a kvtier on each worker host: a worker loads from its own host's tier first, from another host's
tier when the router finds that cheaper than recomputing.

Frontend + router on A; on B and on C a kvtier and an aggregated vLLM worker writing through to its own host's
tier. P is computed on B (into B's tier), evicted from B's engine, then asked on C: C's tier lacks it, the
router names B's (longer run, a fast link: moving beats computing), and C's connector READs the blocks from B's
tier over the bridge, keeping a copy in its own. Once P is evicted from C's engine too, C asks again: now its
own tier holds P, the router names no other, and C loads from its own host's tier.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass

import pytest

from tests.harness.graph import tiny_model_dir, wait_until
from common.protocol import TierStats
from tests.multihost.cluster import Cluster
from tests.multihost.test_vllm_hosts import nixl_args
from tests.multihost.test_vllm_tier_hosts import (
    BLOCK,
    BLOCK_BYTES,
    HOST_CACHE_GB,
    PREFIX,
    READY_TIMEOUT_S,
    VLLM,
    complete,
    settled,
)

pytestmark = [pytest.mark.multihost, pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")]
# 23 full blocks each: one evicts everything else from an engine of 25 blocks (see test_vllm_tier_hosts).
FILLERS = [[3000 + 41 * k + 5 * i for i in range(23 * BLOCK + 3)] for k in range(4)]
SHORT = [7000 + i for i in range(40)]


@dataclass
class Run:
    reference: tuple[str, int]  # P on B, fresh
    from_b: tuple[str, int]  # P on C, from B's tier
    from_own: tuple[str, int]  # P on C again, from C's tier
    tiers: list[tuple[TierStats, TierStats]]  # (B's, C's) tier stats before each of P's loads on C, and after
    log_c: str
    log_router: str


@pytest.fixture(scope="module")
def remote_run(make_module_hosts, tmp_path_factory) -> Run:
    hs = make_module_hosts(3)
    a, b, c = hs
    cl = Cluster(hs, tmp_path_factory.mktemp("vllm-tier-remote"), tiny_model_dir())
    try:
        # Round-robin over the workers sorted by id: requests alternate both-b, both-c.
        cl.router(a, "--policy", "round-robin")
        cl.frontend(a)
        for host, name, core in ((b, "b", "0"), (c, "c", "1")):
            cl.kvtier(host, f"kvtier-{name}", "--host-cache-gb", str(HOST_CACHE_GB), "--block-bytes",
                      str(BLOCK_BYTES))
            cl.worker(host, "both", f"both-{name}", *VLLM, *nixl_args(host), "--kvtier", cl.kvtier_endpoint(host),
                      "--core", core)
        cl.wait_ready(num_prefill=0, num_decode=2, timeout_s=READY_TIMEOUT_S)
        assert wait_until(lambda: cl.tier_stats(b).nixl and cl.tier_stats(c).nixl, timeout_s=30), cl.logs()

        def both() -> tuple[TierStats, TierStats]:
            return settled(cl, b), settled(cl, c)

        reference = complete(cl, PREFIX)  # B
        complete(cl, FILLERS[0])  # C
        complete(cl, FILLERS[1])  # B: P evicted from B's engine
        tiers = [both()]
        from_b = complete(cl, PREFIX)  # C: from B's tier
        tiers.append(both())
        complete(cl, FILLERS[2])  # B
        complete(cl, FILLERS[3])  # C: P evicted from C's engine
        complete(cl, SHORT)  # B
        tiers.append(both())
        from_own = complete(cl, PREFIX)  # C: from its own tier
        tiers.append(both())
        return Run(reference, from_b, from_own, tiers, cl.service("both-c").proc.logs(),
                   cl.service("router").proc.logs())
    except Exception:
        print(cl.logs())
        raise
    finally:
        cl.stop(timeout_s=30)


def loads(log: str) -> list[str]:
    return [line for line in log.splitlines() if "kvtier_loaded" in line]


def test_c_loads_from_bs_tier_when_its_own_lacks_the_prefix(remote_run: Run) -> None:
    assert remote_run.reference[1] == 0
    assert remote_run.from_b == (remote_run.reference[0], 8 * BLOCK)
    (b0, c0), (b1, c1) = remote_run.tiers[:2]
    assert c0.hits_host == 0 and b1.hits_host - b0.hits_host == 8
    assert b1.checksum_failures == 0 and c1.checksum_failures == 0
    assert c1.blocks_stored - c0.blocks_stored == 8  # C kept a copy in its own host's tier
    assert re.search(r"kvtier_remote_named .*num_blocks=8 .*tier_id=kvtier-b\b", remote_run.log_router)
    first = loads(remote_run.log_c)[0]
    print(f"C's loads: {loads(remote_run.log_c)}")
    assert re.search(r"via=nixl\b", first) and re.search(r"num_read=8\b", first), first
    assert re.search(r"source=tcp://[0-9.]+:5570\b", first) and re.search(r"num_blocks=8\b", first), first


def test_then_c_loads_from_its_own_hosts_tier_first(remote_run: Run) -> None:
    assert remote_run.from_own == (remote_run.reference[0], 8 * BLOCK)
    (b2, c2), (b3, c3) = remote_run.tiers[2:]
    assert c3.hits_host - c2.hits_host == 8 and b3.hits_host == b2.hits_host
    assert c3.checksum_failures == 0
    second = loads(remote_run.log_c)[1]
    assert "source=own" in second and re.search(r"num_blocks=8\b", second), second
    assert remote_run.log_router.count("kvtier_remote_named") == 1
