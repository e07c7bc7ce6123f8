"""A finished prefill's KV blocks come back when it is aborted (its decode will not come), not at the 30 s lease.

Real vLLM 0.32 prefill engines (``tests.harness.vllm_smoke``), pull and push side by side, each on its own core:
a prefill-only request finishes and its prompt's blocks stay held for a decode engine that never asks; the
engine's abort of it (what the worker does when the frontend says the decode will not come) frees them.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator

import pytest

from common.tiny_model import make_tiny_model
from tests.services.worker.engines.vllm.test_engine import START_TIMEOUT_S, SmokeEngine, _generate, _prompts, \
    stop_engines

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

RELEASE_DEADLINE_S = 10.0  # well inside the 30 s lease (kv_lease_s) the blocks would otherwise be held for


@pytest.fixture(scope="module")
def prefill_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SmokeEngine]]:
    model = make_tiny_model(tmp_path_factory.mktemp("vllm-lease") / "tiny")
    logs = tmp_path_factory.mktemp("logs")
    engines = {mode: SmokeEngine(model, core_id=core, engine_id=f"prefill-{mode}", kv_role="prefill", log_dir=logs,
                                 kv_transfer=mode)
               for core, mode in enumerate(("pull", "push"))}
    try:
        for engine in engines.values():
            ready = engine.read(START_TIMEOUT_S)
            assert ready["ready"], ready
        yield engines
    finally:
        stop_engines(*engines.values())


def _held_blocks(engine: SmokeEngine) -> int:
    # msgspec leaves out fields at their default: 0 blocks held is no field at all.
    return int(engine.call({"op": "stats"})["load"].get("num_active_blocks", 0))


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_abort_of_a_finished_prefill_frees_its_blocks(prefill_engines: dict[str, SmokeEngine], mode: str) -> None:
    engine = prefill_engines[mode]
    assert _held_blocks(engine) == 0
    prompt = _prompts()[-1]  # 700 tokens: 22 blocks of 32
    first = _generate(engine, "lease-1", prompt, {"max_tokens": 8, "temperature": 0.0}, prefill_only=True)
    assert first["kv_transfer"].get("mode", "pull") == mode and len(first["token_ids"]) == 1  # pull: the default, left out
    held = _held_blocks(engine)
    assert held >= len(prompt) // 32, "the finished prefill keeps its prompt's blocks for the decode"
    assert _held_blocks(engine) == held  # nothing else lets them go

    engine.call({"op": "abort", "request_id": "lease-1"})
    deadline = time.monotonic() + RELEASE_DEADLINE_S
    while (now_held := _held_blocks(engine)) and time.monotonic() < deadline:
        pass
    assert now_held == 0, f"{now_held} blocks still held {RELEASE_DEADLINE_S} s after the abort (log: {engine.log_path})"


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_abort_of_an_unknown_request_is_harmless(prefill_engines: dict[str, SmokeEngine], mode: str) -> None:
    engine = prefill_engines[mode]
    engine.call({"op": "abort", "request_id": "never-sent"})
    first = _generate(engine, "lease-2", _prompts()[0], {"max_tokens": 8, "temperature": 0.0}, prefill_only=True)
    assert len(first["token_ids"]) == 1
    engine.call({"op": "abort", "request_id": "lease-2"})
    engine.call({"op": "abort", "request_id": "lease-2"})  # twice: the second finds no lease and aborts nothing
    deadline = time.monotonic() + RELEASE_DEADLINE_S
    while _held_blocks(engine) and time.monotonic() < deadline:
        pass
    assert _held_blocks(engine) == 0
