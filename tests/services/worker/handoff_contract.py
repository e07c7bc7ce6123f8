"""The hand-off as every engine must keep it (common/continuation.py), one check that each engine's tests run.

A request handed off (the prefill's prompt, the whole budget, the first token) must give the client the same
tokens as the request run whole on one engine, the decode side emitting exactly ``max_tokens - 1`` of them:
an engine (or a frontend) that counts the first token twice, or not at all, fails it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from common.protocol import Handoff, KvTransferParams, SamplingParams
from services.worker.engine import EngineRequest


@dataclass(frozen=True)
class Outcome:
    token_ids: tuple[int, ...]
    finish_reason: str | None
    kv_transfer: KvTransferParams | None = None


Run = Callable[[EngineRequest], Awaitable[Outcome]]


async def check_handoff(name: str, whole: Run, prefill: Run, decode: Run, prompt: tuple[int, ...],
                        sampling: SamplingParams, with_kv: bool) -> None:
    """``whole``, ``prefill``, ``decode``: run a request on the engine that plays each part (one engine may play
    all three); ``with_kv``: the hand-off names the prefill's KV (pulled), else the decode side computes it."""
    agg = await whole(EngineRequest(f"{name}-whole", prompt, sampling))
    assert len(agg.token_ids) == sampling.max_tokens and agg.finish_reason == "length", agg
    first = await prefill(EngineRequest(f"{name}-prefill", prompt, sampling, prefill_only=True))
    assert first.token_ids == agg.token_ids[:1] and first.finish_reason == "length", first
    assert not with_kv or first.kv_transfer is not None
    handoff = Handoff(first.token_ids[0], first.kv_transfer if with_kv else None)
    rest = await decode(EngineRequest(f"{name}-decode", prompt, sampling, handoff=handoff))
    assert len(rest.token_ids) == sampling.max_tokens - 1, f"decode side emitted {len(rest.token_ids)} tokens"
    assert first.token_ids + rest.token_ids == agg.token_ids and rest.finish_reason == "length"
