"""Several models and LoRA adapters behind one `up` (docs/fleet.md), mock engines: the tiny model and a copy of it
under another name, each with its own prefill and decode pool, and one adapter loaded at start and one at run
time. The same wire path as vLLM's (tests/e2e/test_lora_vllm.py proves the adapter's weights reach the KV)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import openai
import pytest

from tests.e2e.test_openai_api import client
from tests.harness.graph import Graph, list_workers, start_graph, tiny_model_dir, wait_until
from tests.harness.lora import tiny_copy_dir, tiny_lora_dir

PROMPT = [(7 * i) % 5000 + 100 for i in range(300)]  # 9 full blocks of 32: remote prefill, cached prefixes


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Graph:
    graph = start_graph(tmp_path_factory.mktemp("fleet"), "--engine", "mock", "--prefill", "1", "--decode", "1",
                        "--mock-speedup", "10", "--num-blocks", "512", "--router-policy", "kv",
                        "--model", str(tiny_model_dir()), "--served-model-name", "tiny",
                        "--model", str(tiny_copy_dir()), "--served-model-name", "tiny-copy,tc",
                        "--lora-modules", f"sql={tiny_lora_dir()}")
    yield graph
    graph.stop()


def _post(graph: Graph, path: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(graph.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _complete(graph: Graph, model: str, prompt=PROMPT):
    return client(graph).completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0,
                                            extra_body={"ignore_eos": True})


def test_models_lists_both_models_their_aliases_and_the_adapter(fleet: Graph) -> None:
    data = client(fleet).models.list().data
    assert [(m.id, m.root, getattr(m, "parent", None)) for m in data] == [
        ("tiny", "tiny", None), ("tiny-copy", "tiny-copy", None), ("tc", "tiny-copy", None), ("sql", "sql", "tiny")]
    workers = asyncio.run(list_workers(fleet.router)).workers
    assert sorted((w.model, w.role, w.lora_names) for w in workers) == [
        ("tiny", "decode", ("sql",)), ("tiny", "prefill", ("sql",)),
        ("tiny-copy", "decode", ()), ("tiny-copy", "prefill", ())]


def test_each_name_runs_on_its_models_workers(fleet: Graph) -> None:
    for model, served in (("tiny", "tiny"), ("tc", "tiny-copy"), ("sql", "sql")):
        out = _complete(fleet, model, PROMPT[:40])
        assert out.model == served and out.usage.completion_tokens == 4
    with pytest.raises(openai.NotFoundError) as err:
        _complete(fleet, "llama")
    assert "'tiny', 'sql', 'tiny-copy', 'tc'" in str(err.value)  # each model, then its adapters


def test_an_adapters_prefixes_are_its_own(fleet: Graph) -> None:
    """The adapter hashes its blocks under its own seed: the base model's cached prompt is no hit for it (its KV
    differs), and its own second run is."""
    prompt = [t + 1 for t in PROMPT]
    _complete(fleet, "tiny", prompt)
    assert _complete(fleet, "tiny", prompt).usage.prompt_tokens_details.cached_tokens == 288
    assert _complete(fleet, "sql", prompt).usage.prompt_tokens_details.cached_tokens == 0
    assert _complete(fleet, "sql", prompt).usage.prompt_tokens_details.cached_tokens == 288


def test_an_adapter_loaded_and_unloaded_at_run_time(fleet: Graph) -> None:
    status, text = _post(fleet, "/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": str(tiny_lora_dir()),
                                                          "model": "tc"})
    assert (status, text) == (200, "Success: LoRA adapter 'chat' added successfully.")
    assert _complete(fleet, "chat", PROMPT[:40]).model == "chat"
    assert "chat" in [m.id for m in client(fleet).models.list().data]
    workers = asyncio.run(list_workers(fleet.router)).workers
    assert all(("chat" in w.lora_names) == (w.model == "tiny-copy") for w in workers)
    status, text = _post(fleet, "/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": "x", "model": "tc"})
    assert status == 400 and "already been loaded" in text
    assert _post(fleet, "/v1/unload_lora_adapter", {"lora_name": "chat", "model": "tiny-copy"})[0] == 200
    assert wait_until(lambda: "chat" not in [m.id for m in client(fleet).models.list().data], timeout_s=5)
    with pytest.raises(openai.NotFoundError):
        _complete(fleet, "chat", PROMPT[:40])
    status, text = _post(fleet, "/v1/unload_lora_adapter", {"lora_name": "chat", "model": "tc"})
    assert status == 404 and "cannot be found" in text
    # Which model an adapter is for must be said when a frontend serves several.
    status, text = _post(fleet, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "y"})
    assert status == 400 and "say which model" in text
