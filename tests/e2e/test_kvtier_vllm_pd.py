"""kvtier on a prefill/decode vLLM graph: both workers run NixlConnector and our kvtier connector inside vLLM's
MultiConnector. Every prompt prefills on the prefill worker (--local-prefill-max-tokens 0). A prefix evicted from
the engines comes back from kvtier into the prefill worker's KV cache, the decode worker pulls it from there over
NIXL, and the output equals the first, fresh one (fp32, greedy, the tiny model)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.harness.graph import start_graph, wait_until, worker_stats
from tests.e2e.test_kvtier_mock import _settled, _tier_up, tier_stats
from tests.e2e.test_kvtier_vllm import FILLERS, PREFIX, complete

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]


def test_prefix_onboarded_under_multiconnector(tmp_path) -> None:
    graph = start_graph(tmp_path, "--engine", "vllm", "--dtype", "float32", "--prefill", "1", "--decode", "1",
                        "--kv-transfer", "pull", "--num-blocks", "25", "--local-prefill-max-tokens", "0",
                        "--host-cache-gb", "0.05")
    try:
        assert wait_until(lambda: _tier_up(graph), timeout_s=20), graph.logs()[-3000:]
        reference, _ = complete(graph, PREFIX)  # prefilled remotely, KV pulled by the decode worker over NIXL
        for filler in FILLERS[:2]:  # evict P from both engines (each filler fills one)
            complete(graph, filler)
        _settled(graph)
        before = tier_stats(graph)
        assert before.blocks_stored >= 8 + 2 * 23
        decode_before = worker_stats(graph.router)["decode-1"]
        text, _ = complete(graph, PREFIX)
        assert text == reference
        # The decode worker pulled this prompt over NIXL (one READ of as many bytes as the first, fresh pull of
        # the same prompt) and computed at most the one token whose logits it needs: no silent recompute
        # (kv_load_failure_policy=recompute would pass the equality above).
        decode = worker_stats(graph.router)["decode-1"]
        assert decode.num_transfers == decode_before.num_transfers + 1
        assert decode.num_transfer_failures == 0
        first_pull, last_pull = decode.recent_transfers[0], decode.recent_transfers[-1]
        assert last_pull.num_bytes == first_pull.num_bytes > 0
        computed = decode.num_prompt_tokens_computed - decode_before.num_prompt_tokens_computed
        pulled = decode.num_prompt_tokens_pulled - decode_before.num_prompt_tokens_pulled
        assert computed <= 1 and pulled >= len(PREFIX) - 1, (computed, pulled)
        after = tier_stats(graph)
        assert after.hits_host - before.hits_host == 8 and after.checksum_failures == 0
        logs = graph.logs()
        assert "MultiConnector" in logs
        assert [line for line in logs.splitlines() if "kvtier_loaded" in line and "worker_id=prefill-0" in line]
    finally:
        graph.stop()
