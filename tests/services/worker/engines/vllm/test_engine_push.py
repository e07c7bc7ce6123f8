"""Push instead of pull: prefill on one vLLM engine, its KV WRITten by it over NIXL into blocks the decode engine
allocated (vLLM 0.32's NixlPushConnector), decode there; greedy output equals one engine's.

Two real engine processes (``tests.harness.vllm_smoke``), each pinned to its own core, fp32, tiny model.
The prefill and the decode request carry one request id, as the frontend's do: the prefill engine matches the
decode engine's block registration to its finished request by that id.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from common.tiny_model import make_tiny_model
from tests.services.worker.engines.vllm.test_engine import (
    MAX_TOKENS,
    PROMPT_LENGTHS,
    START_TIMEOUT_S,
    SmokeEngine,
    _generate,
    _prompts,
    stop_engines,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

# 4-byte K and V, 4 layers x 2 KV heads x 64 dims, 32-token blocks: 128 KiB per block.
BLOCK_BYTES = 32 * 2 * 4 * 2 * 64 * 4


@pytest.fixture(scope="module")
def push_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SmokeEngine, SmokeEngine]]:
    model = make_tiny_model(tmp_path_factory.mktemp("vllm-push") / "tiny")
    logs = tmp_path_factory.mktemp("logs")
    prefill = SmokeEngine(model, core_id=0, engine_id="prefill-0", kv_role="prefill", log_dir=logs,
                          kv_transfer="push")
    decode = SmokeEngine(model, core_id=1, engine_id="decode-0", kv_role="decode", log_dir=logs,
                         kv_transfer="push")
    try:
        for engine in (prefill, decode):
            ready = engine.read(START_TIMEOUT_S)
            assert ready["ready"], ready
        yield prefill, decode
    finally:
        stop_engines(prefill, decode)


def _pushed(prefill: SmokeEngine, decode: SmokeEngine, rid: str, prompt: list[int], sampling: dict) -> list[int]:
    first = _generate(prefill, rid, prompt, sampling, prefill_only=True)
    kv = first["kv_transfer"]
    assert len(first["token_ids"]) == 1 and kv["remote_engine_id"] == "prefill-0" and kv["mode"] == "push"
    handoff = {"first_token_id": first["token_ids"][0], "kv_transfer": kv}  # the prefill's prompt, the whole budget
    rest = _generate(decode, rid, prompt, sampling, handoff=handoff)
    assert rest["finish_reason"] == "length" and not rest["transfer_failed"]
    return first["token_ids"] + rest["token_ids"]


def test_pushed_kv_decodes_like_one_engine(push_engines: tuple[SmokeEngine, SmokeEngine]) -> None:
    prefill, decode = push_engines
    greedy = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    prompts = _prompts()
    # Baselines on the prefill engine: the decode engine must not hold these prompts in its prefix cache.
    expected = [_generate(prefill, f"agg-{i}", p, greedy)["token_ids"] for i, p in enumerate(prompts)]
    before = prefill.call({"op": "stats"})["counters"]

    got = [_pushed(prefill, decode, f"pd-{i}", p, greedy) for i, p in enumerate(prompts)]

    for n, want, have in zip(PROMPT_LENGTHS, expected, got, strict=True):
        assert have == want, f"prompt of {n} tokens: pushed {have} != aggregated {want}"
    d = decode.call({"op": "stats"})
    # Every prompt token's KV arrived from the prefill engine; the decode engine computed none of them...
    assert d["prompt_sources"] == {"num_computed": 0, "num_local_cache_hit": 0,
                                   "num_external_kv_transfer": sum(PROMPT_LENGTHS)}
    # ...and initiated no transfer: the bytes were moved by the prefill engine's WRITEs (its NIXL telemetry).
    assert d["counters"]["num_transfers"] == 0 and d["counters"]["num_transfer_failures"] == 0
    p = prefill.call({"op": "stats"})["counters"]
    assert p["num_transfers"] - before["num_transfers"] == len(prompts)
    assert p["num_transfer_failures"] == 0
    num_blocks = sum(-(-n // 32) for n in PROMPT_LENGTHS)
    assert p["num_transfer_bytes"] - before["num_transfer_bytes"] == num_blocks * BLOCK_BYTES


def test_a_pull_request_to_a_push_engine_is_refused(push_engines: tuple[SmokeEngine, SmokeEngine]) -> None:
    _, decode = push_engines
    kv = {"remote_engine_id": "prefill-0", "remote_block_ids": [1], "remote_host": "127.0.0.1",
          "remote_port": 1, "remote_request_id": "x", "mode": "pull"}
    with pytest.raises(AssertionError, match="moves KV by pull, this decode engine by push"):
        _generate(decode, "mixed", [5, 6, 7], {"max_tokens": 2, "temperature": 0.0},
                  handoff={"first_token_id": 8, "kv_transfer": kv})
