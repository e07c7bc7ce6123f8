"""vLLM engine arguments through `up`, as a vLLM user types them: common ones for every engine and each pool's own,
read back from the running engines (their VllmConfig, as each worker registered it), and a context beyond 8,192
tokens served end to end on a model whose config allows it.

The model is the tiny one with a 16,384-token max_position_embeddings (RoPE: any length runs). Before, `up` had no
engine arguments (`up -tp 2` was "No such option") and every worker capped the context at min(model, 8192)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil

import httpx
import pytest

from tests.harness.graph import list_workers, start_graph, tiny_model_dir

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]

CONTEXT = 12_288  # > 8,192, < the model's 16,384
NAMES = ("tiny-long", "my-alias")


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    model = tmp_path_factory.mktemp("model") / "tiny-16k"
    shutil.copytree(tiny_model_dir(), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16_384}))
    graph = start_graph(
        tmp_path_factory.mktemp("engine-args"), "--model", str(model), "--engine", "vllm", "--no-kvtier",
        "--served-model-name", ",".join(NAMES),
        # Every engine: vLLM's names, its value syntax ("12k" is 12,000; this one is exact).
        "--max-model-len", str(CONTEXT), "--max-num-seqs", "16",
        "--prefill-args", f"--max-num-batched-tokens {CONTEXT}",
        "--decode-args", "--max-num-seqs 8 --max-num-batched-tokens 256 --enforce-eager")
    yield graph
    graph.stop()


def _settings(graph) -> dict[str, dict[str, str]]:
    listed = asyncio.run(list_workers(graph.router))
    return {w.role: dict(w.engine_settings) for w in listed.workers}


def test_each_engine_runs_with_the_common_and_its_pools_engine_arguments(graph) -> None:
    settings = _settings(graph)
    assert set(settings) == {"prefill", "decode"}
    prefill, decode = settings["prefill"], settings["decode"]
    assert prefill["max_model_len"] == decode["max_model_len"] == str(CONTEXT)
    assert prefill["max_num_seqs"] == "16"  # common
    assert decode["max_num_seqs"] == "8"  # the pool's own wins over the common one
    assert prefill["max_num_batched_tokens"] == str(CONTEXT)
    assert decode["max_num_batched_tokens"] == "256"
    assert decode["enforce_eager"] == prefill["enforce_eager"] == "True"  # on CPU by default too
    assert prefill["block_size"] == decode["block_size"] == "32"


def test_a_prompt_beyond_8192_tokens_is_served_and_aliases_answer(graph) -> None:
    # ~10,000 tokens: words of the tokenizer's training text, each a token or two.
    prompt = " ".join(f"line{i % 997} value" for i in range(2_600))
    resp = httpx.post(graph.url + "/v1/completions", timeout=300, json={
        "model": NAMES[1], "prompt": prompt, "max_tokens": 2, "temperature": 0})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert 8_192 < body["usage"]["prompt_tokens"] < CONTEXT
    assert body["model"] == NAMES[0]  # as vLLM: responses carry the first served name
    models = httpx.get(graph.url + "/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == list(NAMES)
    too_long = httpx.post(graph.url + "/v1/completions", timeout=60, json={
        "model": NAMES[0], "prompt": prompt + prompt, "max_tokens": 2})
    assert too_long.status_code == 400 and str(CONTEXT) in too_long.text
