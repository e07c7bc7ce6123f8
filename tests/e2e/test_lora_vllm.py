"""A LoRA adapter on real vLLM engines, P/D and aggregated (docs/fleet.md#lora-adapters): the tiny model with a
random adapter (tests/harness/lora.py), fp32, greedy. Outputs with the adapter differ from the base model's (its
weights reach the prefill and the decode engine), and P/D outputs equal one aggregated engine's token for token:
the KV the decode engine pulled is the adapter's. The aggregated arm is one `up` serving two models (the tiny
model and a copy of it under another name, an engine each) and the adapter, and loads the adapter again at run
time under a second name, which must answer the same."""

from __future__ import annotations

import importlib.util
import json
import urllib.request

import pytest

from tests.e2e.reference import VLLM_ARGS, prompt
from tests.e2e.test_disaggregation_mock import metric
from tests.e2e.test_openai_api import client
from tests.e2e.test_vllm_disagg import PD_ROUTER_ARGS
from tests.harness.graph import start_graph, tiny_model_dir
from tests.harness.lora import tiny_copy_dir, tiny_lora_dir

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]
# Local (under the 64-token threshold), then remote prefills of a few blocks.
LENGTHS = (20, 100, 300)


def _complete(graph, model: str, tokens: list[int]) -> str:
    """Greedy text of 12 tokens (the same tokenizer everywhere: equal text is equal tokens here)."""
    out = client(graph).completions.create(model=model, prompt=tokens, max_tokens=12, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert out.model == model and out.usage.completion_tokens == 12
    return out.choices[0].text


def test_adapter_outputs_differ_from_the_base_and_pd_equals_aggregated(tmp_path) -> None:
    lora = f"sql={tiny_lora_dir()}"
    prompts = {n: prompt(n, salt=900 + n) for n in LENGTHS}
    (tmp_path / "pd").mkdir()
    (tmp_path / "agg").mkdir()
    pd = start_graph(tmp_path / "pd", *VLLM_ARGS, *PD_ROUTER_ARGS, "--prefill", "1", "--decode", "1",
                     "--kv-transfer", "pull", "--lora-modules", lora)
    try:
        pd_base = {n: _complete(pd, "tiny", p) for n, p in prompts.items()}
        pd_lora = {n: _complete(pd, "sql", p) for n, p in prompts.items()}
        remote = metric(pd, 'splitserve_frontend_prefill_decisions_total{where="remote"}')
    finally:
        pd.stop()  # a third engine beside these would not fit on 2 cores
    assert remote == 2 * sum(n > 64 for n in LENGTHS)  # base and adapter alike went prefill -> decode
    for n in LENGTHS:
        assert pd_lora[n] != pd_base[n], f"the adapter changed nothing on a prompt of {n} tokens"
    agg = start_graph(tmp_path / "agg", *VLLM_ARGS, "--aggregated", "1", "--lora-modules", lora,
                      "--model", str(tiny_model_dir()), "--served-model-name", "tiny",
                      "--model", str(tiny_copy_dir()), "--served-model-name", "tiny-copy")
    try:
        req = urllib.request.Request(agg.url + "/v1/load_lora_adapter", method="POST", data=json.dumps(
            {"lora_name": "sql-again", "lora_path": str(tiny_lora_dir()), "model": "tiny"}).encode(),
            headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            assert resp.status == 200
        for n, p in prompts.items():
            assert _complete(agg, "tiny", p) == pd_base[n], f"base model, prompt of {n} tokens"
            assert _complete(agg, "tiny-copy", p) == pd_base[n], f"the second model (same weights), {n} tokens"
            assert _complete(agg, "sql", p) == pd_lora[n], f"adapter, prompt of {n} tokens"
            assert _complete(agg, "sql-again", p) == pd_lora[n], f"adapter loaded at run time, {n} tokens"
    finally:
        agg.stop()
