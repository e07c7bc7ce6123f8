"""--mock-nixl: content keys and descriptor runs (pure), then two mock engines in one process moving real bytes with
real NIXL agents (UCX in one process: what crosses is the bytes, checked block by block)."""

from __future__ import annotations

import asyncio
import importlib.util
import math
from collections.abc import AsyncIterator

import pytest

from common.hashing import block_hashes
from common.protocol import Handoff, SamplingParams
from common.timing import TimingModel
from services.worker.engine import EngineOutput, EngineRequest
from services.worker.engines.mock.block_manager import BlockManager
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.engine import MockEngine
from services.worker.engines.mock.nixl_kv import block_keys, runs
from services.worker.engines.mock.payload import fake_kv_payload

BS = 16
KV_PER_TOKEN = 64  # 1 KiB blocks: small, and still many descriptors' worth
PROMPT = tuple(range(100, 137))  # 37 tokens: 2 full blocks and a partial one


def test_block_keys_are_the_block_hashes_then_the_partial_block_chained_on() -> None:
    keys = block_keys(PROMPT, BS, seed=7)
    assert keys[:2] == block_hashes(PROMPT, BS, 7) and len(keys) == 3
    assert keys[2] != block_keys(PROMPT[:-1] + (999,), BS, 7)[2]  # the partial block's tokens count
    assert keys[2] != block_keys((1,) * 32 + PROMPT[32:], BS, 7)[2]  # and so does its prefix
    assert block_keys(PROMPT[:32], BS, 7) == keys[:2]
    assert block_keys((5, 6), BS, 7) != [] and block_keys((), BS, 7) == []


@pytest.mark.parametrize(("local", "remote", "expected"), [
    ((), (), []),
    ((3, 4, 5), (10, 11, 12), [(3, 10, 3)]),
    ((3, 4, 9), (10, 11, 12), [(3, 10, 2), (9, 12, 1)]),
    ((3, 4, 5), (10, 12, 13), [(3, 10, 1), (4, 12, 2)]),
    ((5, 4), (1, 0), [(5, 1, 1), (4, 0, 1)]),
])
def test_runs_coalesce_only_blocks_adjacent_on_both_sides(local, remote, expected) -> None:
    assert runs(local, remote) == expected


def test_runs_refuse_unequal_sides() -> None:
    with pytest.raises(ValueError):
        runs((1, 2), (1,))


def test_pin_keeps_a_freed_block_from_reuse_until_unpinned() -> None:
    bm = BlockManager(4, BS)
    match = bm.match_prefix(PROMPT[:-1])
    assert bm.allocate("a", match, len(PROMPT))
    ids = bm.block_ids("a")
    bm.commit("a", PROMPT, len(PROMPT))
    bm.pin(ids)
    bm.free("a")
    assert bm.num_free_blocks == 1  # the 3 pinned (2 cached, 1 partial) are not
    bm.unpin(ids)
    assert bm.num_free_blocks == 4 and bm.match_prefix(PROMPT).num_cached_tokens == 32


# ---------------------------------------------------------------------------------------------- engines


def _config(engine_id: str, **overrides: object) -> MockEngineConfig:
    fields: dict[str, object] = {"num_blocks": 32, "block_size": BS, "timing": TimingModel(speedup=math.inf),
                                 "vocab_size": 1000, "kv_bytes_per_token": KV_PER_TOKEN, "engine_id": engine_id,
                                 "nixl": True, "kv_transfer": "pull", "hash_seed": 11}
    fields.update(overrides)
    return MockEngineConfig(**fields)  # type: ignore[arg-type]


@pytest.fixture
async def pair(request) -> AsyncIterator[tuple[MockEngine, MockEngine]]:
    if importlib.util.find_spec("nixl") is None:
        pytest.skip("nixl is not installed (make setup installs it)")
    overrides = getattr(request, "param", {})
    prefill, decode = MockEngine(_config("p", **overrides)), MockEngine(_config("d", **overrides))
    await prefill.start()
    await decode.start()
    yield prefill, decode
    await decode.shutdown()
    await prefill.shutdown()


def _req(rid: str, tokens: tuple[int, ...], max_tokens: int, **kwargs: object) -> EngineRequest:
    return EngineRequest(rid, tokens, SamplingParams(max_tokens=max_tokens, seed=1, ignore_eos=True), **kwargs)


async def _run(engine: MockEngine, request: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(request)]


async def _prefill_then_decode(prefill: MockEngine, decode: MockEngine, rid: str,
                               corrupt: bool = False) -> list[EngineOutput]:
    first = (await _run(prefill, _req(rid, PROMPT, 1, prefill_only=True)))[-1]
    kv = first.kv_transfer
    assert kv is not None and kv.nixl_metadata and kv.nixl_block_bytes == BS * KV_PER_TOKEN
    assert kv.num_bytes == 3 * BS * KV_PER_TOKEN and kv.remote_request_id
    if corrupt:
        prefill._nixl.region.buf[kv.remote_block_ids[-1] * kv.nixl_block_bytes + 5] ^= 0xFF  # one wrong byte (the last block: the decode engine has cached the first two)
    return await _run(decode, _req(rid, PROMPT, 5, handoff=Handoff(first.token_ids[0], kv)))


async def _all_free(*engines: MockEngine) -> bool:
    for _ in range(200):
        if all(e.load().num_free_blocks == e.num_blocks for e in engines):
            return True
        await asyncio.sleep(0.01)
    return False


async def test_decode_reads_the_prefill_blocks_bytes_and_they_check(pair) -> None:
    prefill, decode = pair
    outs = await _prefill_then_decode(prefill, decode, "r1")
    assert [o.finish_reason for o in outs][-1] == "length" and not any(o.transfer_failed for o in outs)
    c = decode.counters()
    assert (c.num_transfers, c.num_transfer_failures, c.num_transfer_bytes) == (1, 0, 3 * BS * KV_PER_TOKEN)
    sample = c.recent_transfers[-1]
    assert not sample.simulated and sample.src_worker_id == "p" and sample.num_descriptors >= 1
    assert decode.simulated_transfers is False
    # The decode engine's cached blocks hold the bytes of their keys, as the prefill engine wrote them.
    region, keys = decode._nixl.region, block_keys(PROMPT, BS, 11)
    ids = [decode._blocks._cached[h] for h in keys[:2]]
    assert bytes(region._block(ids[0])) == fake_kv_payload(keys[0], BS * KV_PER_TOKEN)
    assert region.intact(ids, keys[:2])
    assert await _all_free(prefill, decode), "the READ's notification frees the prefill side's held blocks"


async def test_a_wrong_byte_recomputes_the_prompt_and_frees_both_sides(pair) -> None:
    prefill, decode = pair
    good = await _prefill_then_decode(prefill, decode, "ok")
    bad = await _prefill_then_decode(prefill, decode, "bad", corrupt=True)
    assert bad[0].transfer_failed and not any(o.transfer_failed for o in bad[1:])
    assert [t for o in bad for t in o.token_ids] == [t for o in good for t in o.token_ids]  # recomputed, same
    c = decode.counters()
    assert (c.num_transfers, c.num_transfer_failures) == (1, 1)  # the failed READ taught nothing
    assert await _all_free(prefill, decode)


@pytest.mark.parametrize("pair", [{"nixl_hold_s": 0.2}], indirect=True)
async def test_blocks_no_decode_engine_reads_are_freed_after_the_hold(pair) -> None:
    prefill, _ = pair
    first = (await _run(prefill, _req("lost", PROMPT, 1, prefill_only=True)))[-1]
    assert first.kv_transfer is not None
    assert prefill.load().num_free_blocks == prefill.num_blocks - 3  # held for a decode engine
    assert await _all_free(prefill) and prefill._nixl.num_expired == 1


async def test_a_peer_gone_before_the_read_recomputes_and_frees(pair) -> None:
    prefill, decode = pair
    first = (await _run(prefill, _req("gone", PROMPT, 1, prefill_only=True)))[-1]
    await prefill.shutdown()  # its region deregistered: the READ is refused
    outs = await _run(decode, _req("gone", PROMPT, 5, handoff=Handoff(first.token_ids[0], first.kv_transfer)))
    assert outs[0].transfer_failed and outs[-1].finish_reason == "length"
    assert decode.counters().num_transfer_failures == 1
    assert await _all_free(decode)


def test_nixl_refuses_push() -> None:
    with pytest.raises(ValueError, match="pull"):
        MockEngine(_config("x", kv_transfer="push"))


async def test_a_prefill_engine_without_a_region_is_refused_and_the_prompt_recomputed(pair) -> None:
    _, decode = pair
    plain = MockEngine(_config("plain", nixl=False))
    await plain.start()
    try:
        first = (await _run(plain, _req("sim", PROMPT, 1, prefill_only=True)))[-1]
        assert first.kv_transfer is not None and not first.kv_transfer.nixl_metadata
        outs = await _run(decode, _req("sim", PROMPT, 5, handoff=Handoff(first.token_ids[0], first.kv_transfer)))
        assert outs[0].transfer_failed and outs[-1].finish_reason == "length"
        assert decode.counters().num_transfers == 0  # nothing simulated slipped into the real log
    finally:
        await plain.shutdown()
