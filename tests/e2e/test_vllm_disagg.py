"""The real path through the HTTP API: vLLM prefill worker -> NIXL -> vLLM decode worker, against one vLLM
engine doing both. fp32, greedy: outputs must match token for token (compared as text of the same tokens)."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys

import pytest

from tests.harness.graph import (
    REPO,
    Graph,
    list_workers,
    start_graph,
    wait_until,
    worker_stats,
)
from tests.e2e.reference import VLLM_ARGS, Reference, complete, prompt
from tests.e2e.test_disaggregation_mock import metric
from tests.e2e.test_openai_api import MODEL, client
from tests.e2e.test_vllm_disagg_push import LENGTHS as PUSH_LENGTHS
from tests.multihost.test_vllm_hosts import LENGTHS as HOSTS_LENGTHS

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]
# The P/D graph's router keeps its default link prices (32 pulls before it learns; this test makes 5): which
# side prefills then follows from the prompt lengths alone, not from how fast a loaded CI machine timed a pull
# (one slow pull once priced the link below local prefill). Learning links from pulls is tested in
# tests/e2e/test_disaggregation_mock.py and tests/services/router/.
PD_ROUTER_ARGS = ("--router-link-min-samples", "32")
# Assorted lengths: tiny, around a block (32), not multiples of it, up to ~1,500 tokens.
LENGTHS = (3, 31, 33, 65, 100, 257, 700, 1500)


@pytest.fixture(scope="module")
def vllm_pd(tmp_path_factory) -> Graph:
    graph = start_graph(tmp_path_factory.mktemp("vllm-pd"), *VLLM_ARGS, *PD_ROUTER_ARGS, "--prefill", "1",
                        "--decode", "1", "--kv-transfer", "pull")
    yield graph
    graph.stop()


def test_disaggregated_equals_aggregated_through_http(vllm_pd: Graph, vllm_reference: Reference, tmp_path) -> None:
    # A different salt per length: prompts must not share prefixes, or the cached part makes prefill local.
    pd = {n: complete(vllm_pd, prompt(n, salt=n)) for n in LENGTHS}
    stats = worker_stats(vllm_pd.router)
    remote = metric(vllm_pd, 'splitserve_frontend_prefill_decisions_total{where="remote"}')
    # vLLM's telemetry names no peer: each pull is attributed to the prefill worker (the only one it could come
    # from) once a heartbeat has carried it to the router. Both workers registered their KV size.
    assert wait_until(lambda: {p.src_worker_id for p in worker_stats(vllm_pd.router)["decode-1"].recent_transfers}
                      == {"prefill-0"}, timeout_s=5)
    assert all(info.kv_bytes_per_token > 0 for info in asyncio.run(list_workers(vllm_pd.router)).workers)
    vllm_pd.stop()  # two more engines would not fit beside these on 2 cores
    agg = start_graph(tmp_path, *VLLM_ARGS, "--aggregated", "1")
    try:
        for n in LENGTHS:
            out = complete(agg, prompt(n, salt=n))
            vllm_reference.record(prompt(n, salt=n), out)
            assert out == pd[n], f"prompt of {n} tokens"
        # While this engine is up: the prompts of the later tests that compare with one engine (the push test's,
        # the multihost one's: it salts each prompt by its length too); they then start none.
        vllm_reference.outputs([], extra=[prompt(n, salt=n) for n in (*PUSH_LENGTHS, *HOSTS_LENGTHS)], graph=agg)
        # Negative control: equality above only proves the pulled KV right if wrong KV would change the output.
        # The same prompts with one early block's tokens changed (its KV then differs, as a corrupted pull's
        # would) must give other outputs; a model blind to its context would pass the equality with any KV.
        for n in (257, 700, 1500):
            altered = prompt(n, salt=n)
            altered[32:64] = [(t + 1) % 8000 + 100 for t in altered[32:64]]
            assert complete(agg, altered) != pd[n], f"output of {n} tokens ignores its second block"
        # vLLM's prefix cache, reported in usage: the 700-token prompt again reuses its 21 full blocks.
        again = client(agg).completions.create(model=MODEL, prompt=prompt(700, salt=700), max_tokens=2,
                                               temperature=0, extra_body={"ignore_eos": True})
        assert again.usage.prompt_tokens_details.cached_tokens == 672
    finally:
        agg.stop()
    assert all(num == 16 for _, num in pd.values())
    # Every prompt above the local-prefill threshold went prefill -> decode, with its KV pulled over NIXL.
    num_remote = sum(1 for n in LENGTHS if n > 64)
    assert remote == num_remote
    decode = stats["decode-1"]
    assert decode.num_transfers == num_remote and decode.num_transfer_failures == 0
    assert decode.num_transfer_bytes > 0
    # One telemetry sample per READ, in order; longer prompts (sent in increasing length) pull more bytes.
    pulls = decode.recent_transfers
    assert [p.seq for p in pulls] == list(range(1, num_remote + 1))
    assert sum(p.num_bytes for p in pulls) == decode.num_transfer_bytes
    assert all(p.seconds > 0 and p.num_descriptors > 0 for p in pulls)
    sizes = [p.num_bytes for p in pulls]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


def test_missing_or_broken_model_dir_fails_at_start(tmp_path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    for model in (tmp_path / "absent", tmp_path / "broken"):
        proc = subprocess.run([sys.executable, "-m", "cli.main", "worker", "--engine", "vllm", "--model", str(model)],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2
        assert "model" in proc.stderr.lower() and str(model) in proc.stderr
        assert "Traceback" not in proc.stderr
