"""Mock engine: the Engine contract end to end at infinite speedup."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import pytest

from common.errors import EngineError
from common.hashing import block_hashes
from common.protocol import Handoff, KvTransferParams, SamplingParams
from common.timing import TimingModel
from services.worker.engine import Engine, EngineOutput, EngineRequest
from services.worker.engines.mock.block_manager import BlocksStored
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.engine import MockEngine
from services.worker.engines.mock.tokens import next_token_id
from tests.services.worker.handoff_contract import Outcome, check_handoff

FAST = TimingModel(speedup=math.inf)
PROMPT = tuple(range(100, 137))  # 37 tokens: 2 full blocks of 16 and a partial one


def _config(**overrides: object) -> MockEngineConfig:
    fields: dict[str, object] = {"num_blocks": 64, "block_size": 16, "timing": FAST, "vocab_size": 1000}
    fields.update(overrides)
    return MockEngineConfig(**fields)  # type: ignore[arg-type]


@pytest.fixture
async def engine() -> AsyncIterator[MockEngine]:
    eng = MockEngine(_config())
    await eng.start()
    yield eng
    await eng.shutdown()


def _request(rid: str, tokens: tuple[int, ...] = PROMPT, max_tokens: int = 8, **kwargs: object) -> EngineRequest:
    sampling = SamplingParams(
        max_tokens=max_tokens,
        seed=kwargs.pop("seed", 1),  # type: ignore[arg-type]
        stop_token_ids=kwargs.pop("stop_token_ids", ()),  # type: ignore[arg-type]
        ignore_eos=kwargs.pop("ignore_eos", False),  # type: ignore[arg-type]
    )
    return EngineRequest(rid, tokens, sampling, **kwargs)  # type: ignore[arg-type]


async def _collect(engine: MockEngine, request: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(request)]


def _tokens(outputs: list[EngineOutput]) -> list[int]:
    return [token for out in outputs for token in out.token_ids]


async def test_satisfies_the_engine_protocol(engine: MockEngine) -> None:
    typed: Engine = engine
    assert (typed.block_size, typed.num_blocks, typed.max_model_len) == (16, 64, 4096)


async def test_one_token_per_output_then_length(engine: MockEngine) -> None:
    outputs = await _collect(engine, _request("a", max_tokens=5))
    assert [len(out.token_ids) for out in outputs] == [1] * 5
    assert [out.finish_reason for out in outputs] == [None] * 4 + ["length"]
    assert all(out.num_prompt_tokens == len(PROMPT) for out in outputs)
    assert engine.load().num_free_blocks == 64


async def test_tokens_are_deterministic_per_prompt_and_seed(engine: MockEngine) -> None:
    first = _tokens(await _collect(engine, _request("a", seed=3)))
    again = _tokens(await _collect(engine, _request("b", seed=3)))
    other = _tokens(await _collect(engine, _request("c", seed=4)))
    assert first == again and first != other
    assert all(0 <= token < 1000 and token != 0 for token in first)  # never eos (id 0) by default
    expected = list(PROMPT)
    for _ in range(8):
        expected.append(next_token_id(expected, 3, engine.config))
    assert first == expected[len(PROMPT):]


def _runner(engine: MockEngine):
    async def run(request: EngineRequest) -> Outcome:
        outs = await _collect(engine, request)
        return Outcome(tuple(_tokens(outs)), outs[-1].finish_reason, outs[-1].kv_transfer)
    return run


@pytest.mark.parametrize("with_kv", [True, False])
async def test_the_handoff_contract(with_kv: bool) -> None:
    engines = [MockEngine(_config(engine_id=name)) for name in ("whole", "prefill", "decode")]
    for eng in engines:
        await eng.start()
    sampling = SamplingParams(max_tokens=6, seed=2, ignore_eos=True)
    await check_handoff("h", *(_runner(e) for e in engines), PROMPT, sampling, with_kv)
    for eng in engines:
        await eng.shutdown()


async def test_disaggregated_equals_aggregated() -> None:
    prefill = MockEngine(_config(engine_id="prefill-0", kv_bytes_per_token=100))
    decode = MockEngine(_config(engine_id="decode-0", kv_bytes_per_token=100))
    for eng in (prefill, decode):
        await eng.start()
    aggregated = _tokens(await _collect(decode, _request("agg", max_tokens=6)))
    decode_fresh = MockEngine(_config(kv_bytes_per_token=100))
    await decode_fresh.start()

    first = await _collect(prefill, _request("p", max_tokens=6, prefill_only=True))
    assert len(first) == 1 and first[0].finish_reason == "length"
    params = first[0].kv_transfer
    assert params is not None and params.remote_engine_id == "prefill-0"
    assert len(params.remote_block_ids) == 3 and params.num_bytes == len(PROMPT) * 100
    assert prefill.load().num_free_blocks == 64  # freed, its full blocks still cached
    assert prefill.counters().num_transfers == 0

    rest = await _collect(decode_fresh, _request("d", PROMPT, 6, handoff=Handoff(first[0].token_ids[0], params)))
    assert first[0].token_ids + tuple(_tokens(rest)) == tuple(aggregated)
    assert rest[-1].finish_reason == "length" and rest[0].num_cached_tokens == 0
    counters = decode_fresh.counters()
    assert (counters.num_transfers, counters.num_transfer_bytes) == (1, len(PROMPT) * 100)
    assert counters.transfer_seconds == (0.0,)
    assert decode_fresh.counters().transfer_seconds == ()  # drained
    # Each pull names the worker it came from, and says it was simulated (the router learns no link from it).
    assert [(t.seq, t.num_bytes, t.src_worker_id, t.simulated) for t in decode_fresh.counters().recent_transfers] == [
        (1, len(PROMPT) * 100, "prefill-0", True)]
    assert decode_fresh.kv_bytes_per_token == 100
    assert decode_fresh.load().num_free_blocks == 64
    for eng in (prefill, decode, decode_fresh):
        await eng.shutdown()


async def test_prefix_hits_are_reported_and_counted(engine: MockEngine) -> None:
    first = await _collect(engine, _request("a", max_tokens=2))
    assert first[0].num_cached_tokens == 0
    assert engine.drain_kv_events() == [BlocksStored(tuple(block_hashes(PROMPT, 16, 0)), None)]
    second = await _collect(engine, _request("b", max_tokens=2))
    assert all(out.num_cached_tokens == 32 for out in second)
    assert engine.counters().num_prefix_hits == 1
    assert engine.drain_kv_events() == []  # the third block (38 tokens computed) never filled


async def test_stop_token_and_ignore_eos(engine: MockEngine) -> None:
    tokens = _tokens(await _collect(engine, _request("a", max_tokens=8)))
    stop_id = tokens[3]
    cut = tokens.index(stop_id) + 1
    stopped = await _collect(engine, _request("b", max_tokens=8, stop_token_ids=(stop_id,)))
    assert _tokens(stopped) == tokens[:cut] and stopped[-1].finish_reason == "stop"
    # ignore_eos leaves the stop ids in force, as vLLM does: the frontend leaves the model's end ids out of them.
    kept = await _collect(engine, _request("c", max_tokens=8, stop_token_ids=(stop_id,), ignore_eos=True))
    assert _tokens(kept) == tokens[:cut] and kept[-1].finish_reason == "stop"


async def test_abort_ends_the_stream_and_frees_blocks(engine: MockEngine) -> None:
    stream = engine.generate(_request("a", max_tokens=500))
    first = await anext(stream)
    assert first.finish_reason is None
    assert engine.load().num_running == 1 and engine.load().num_active_blocks == 3
    await engine.abort("a")
    rest = [out async for out in stream]
    assert [out.finish_reason for out in rest][-1] == "abort"
    # The mock counts queued prefill tokens (0 now; -1 would mean "not counted").
    assert engine.load() == engine.load().__class__(num_free_blocks=64, num_total_blocks=64, num_waiting_tokens=0)
    await engine.abort("a")  # unknown now: ignored


async def test_consumer_leaving_early_frees_blocks(engine: MockEngine) -> None:
    stream = engine.generate(_request("a", max_tokens=500))
    await anext(stream)
    await stream.aclose()
    assert engine.load().num_free_blocks == 64 and engine.load().num_running == 0


async def test_impossible_requests_raise_engine_error() -> None:
    eng = MockEngine(_config(num_blocks=4, max_model_len=100))
    await eng.start()
    with pytest.raises(EngineError, match="max_model_len"):
        await _collect(eng, _request("long", max_tokens=64))
    with pytest.raises(EngineError, match="KV blocks"):
        await _collect(eng, _request("big", tuple(range(60)), max_tokens=10))
    with pytest.raises(EngineError, match="empty"):
        await _collect(eng, _request("empty", ()))
    await eng.shutdown()
    with pytest.raises(EngineError, match="not running"):
        await _collect(eng, _request("late"))


async def test_many_requests_under_preemption_give_the_same_tokens() -> None:
    solo = MockEngine(_config())
    busy = MockEngine(_config(num_blocks=12, max_num_seqs=6, max_num_batched_tokens=64))
    for eng in (solo, busy):
        await eng.start()
    prompts = [tuple(range(i * 50, i * 50 + 20 + i)) for i in range(8)]
    expected = [_tokens(await _collect(solo, _request(f"s{i}", p, 40))) for i, p in enumerate(prompts)]
    results = await asyncio.gather(*(_collect(busy, _request(f"b{i}", p, 40)) for i, p in enumerate(prompts)))
    assert [_tokens(outs) for outs in results] == expected
    assert busy.load().num_free_blocks == 12 and busy.load().num_waiting == 0
    for eng in (solo, busy):
        await eng.shutdown()


async def test_zero_delay_still_yields_to_the_event_loop(engine: MockEngine) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await _collect(engine, _request("a", max_tokens=50))
    task.cancel()
    assert ticks >= 25


async def test_step_loop_failure_reaches_waiting_requests(
    engine: MockEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(engine._scheduler, "update", broken)
    with pytest.raises(EngineError, match="boom") as info:
        await _collect(engine, _request("a"))
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(EngineError, match="boom"):
        await _collect(engine, _request("b"))


async def test_real_time_speedup_sleeps() -> None:
    timing = TimingModel(prefill_coeffs_s=(0.02,), decode_base_s=0.02, decode_per_seq_s=0.0,
                         decode_per_kv_token_s=0.0)
    eng = MockEngine(_config(timing=timing))
    await eng.start()
    loop = asyncio.get_running_loop()
    start_s = loop.time()
    await _collect(eng, _request("a", max_tokens=3))  # one prefill step, two decode steps
    assert loop.time() - start_s >= 0.055
    await eng.shutdown()


async def test_load_reports_queued_prefill_tokens_and_the_measured_prefill_rate() -> None:
    # 0.1 s per prefill step whatever its size: a 200-token prompt is prefilled at 2,000 tokens/s; 10x faster
    # in wall time at speedup 10.
    timing = TimingModel(prefill_coeffs_s=(0.1,), decode_base_s=0.0, decode_per_seq_s=0.0,
                         decode_per_kv_token_s=0.0, speedup=10.0)
    eng = MockEngine(_config(timing=timing, max_num_batched_tokens=256))
    await eng.start()
    assert (eng.load().num_waiting_tokens, eng.load().prefill_tokens_per_s) == (0, 0.0)
    stream = eng.generate(_request("a", tuple(range(100, 300)), max_tokens=3))
    await anext(stream)
    assert eng.load().prefill_tokens_per_s == pytest.approx(20_000.0)
    assert [out.finish_reason async for out in stream][-1] == "length"
    # Decode steps and short prefills (the last token after a pull) leave the rate alone.
    await _collect(eng, _request("b", tuple(range(5, 10)), max_tokens=2))
    assert eng.load().prefill_tokens_per_s == pytest.approx(20_000.0)
    await eng.shutdown()


@pytest.mark.parametrize("mode", ["pull", "push"])
async def test_a_pull_stalls_the_decode_step_a_push_does_not(mode: str) -> None:
    # 10 ms decode steps, 0.4 s to move a prompt's KV. Pull: the decode engine READs inside a step, so a
    # stream decoding beside it waits the whole transfer once. Push: the prefill engine WRITEs; the stream goes on.
    timing = TimingModel(prefill_coeffs_s=(0.0,), decode_base_s=0.01, decode_per_seq_s=0.0,
                         decode_per_kv_token_s=0.0, transfer_latency_s=0.4)
    eng = MockEngine(_config(timing=timing, kv_transfer=mode))
    await eng.start()
    loop = asyncio.get_running_loop()
    times: list[float] = []

    async def steady() -> None:
        async for _ in eng.generate(_request("steady", tuple(range(5, 10)), max_tokens=60)):
            times.append(loop.time())

    task = asyncio.create_task(steady())
    while len(times) < 5:
        await asyncio.sleep(0.005)
    kv = KvTransferParams(remote_engine_id="prefill-0", remote_block_ids=(0, 1, 2), mode=mode)
    pulled = await _collect(eng, _request("pd", PROMPT, 4, handoff=Handoff(7, kv)))
    await task
    assert pulled[-1].finish_reason == "length" and eng.counters().num_transfers == 1
    longest_gap_s = max(b - a for a, b in zip(times, times[1:]))
    if mode == "pull":
        assert longest_gap_s >= 0.4
    else:
        assert longest_gap_s < 0.2
    # The other mode's prefill engine is refused, not silently mixed.
    other = KvTransferParams(remote_engine_id="p", remote_block_ids=(0,), mode="push" if mode == "pull" else "pull")
    with pytest.raises(EngineError, match="moves KV by"):
        await _collect(eng, _request("mixed", PROMPT, 4, handoff=Handoff(7, other)))
    await eng.shutdown()


async def test_an_adapters_blocks_hash_under_its_seed_and_only_held_adapters_run() -> None:
    from common.hashing import adapter_seed
    from common.protocol import LoadAdapter, UnloadAdapter
    from services.worker.adapters import change_adapter

    engine = MockEngine(_config(hash_seed=5, lora_names=("sql",)))
    await engine.start()
    try:
        await _collect(engine, _request("a", max_tokens=2, lora_name="sql"))
        assert engine.drain_kv_events() == [BlocksStored(tuple(block_hashes(PROMPT, 16, adapter_seed(5, "sql"))), None)]
        base = await _collect(engine, _request("b", max_tokens=2))
        assert base[0].num_cached_tokens == 0  # the adapter's cached prompt is no hit for the base model
        with pytest.raises(EngineError, match="'chat' is not loaded"):
            await _collect(engine, _request("c", max_tokens=2, lora_name="chat"))
        done = await change_adapter(engine, LoadAdapter(request_id="l", lora_name="chat", lora_path="/x"), "w")
        assert done.ok and engine.lora_names() == ("chat", "sql")
        assert len(_tokens(await _collect(engine, _request("d", max_tokens=2, lora_name="chat")))) == 2
        again = await change_adapter(engine, LoadAdapter(request_id="l2", lora_name="chat", lora_path="/x"), "w")
        assert not again.ok and "already loaded" in again.message
        assert (await change_adapter(engine, UnloadAdapter(request_id="u", lora_name="sql"), "w")).ok
        assert engine.lora_names() == ("chat",)
    finally:
        await engine.shutdown()


async def test_a_sink_takes_outputs_in_the_step_until_it_declines_one(engine: MockEngine) -> None:
    reference = _tokens(await _collect(engine, _request("ref", max_tokens=6)))
    taken: list[EngineOutput] = []
    every = [out async for out in engine.generate(_request("a", max_tokens=6), lambda out: not taken.append(out))]
    assert every == [] and _tokens(taken) == reference and taken[-1].finish_reason == "length"

    # Declined at the third: that one and every later one are yielded, in order, and the sink is not asked again.
    offered: list[EngineOutput] = []

    def sink(out: EngineOutput) -> bool:
        offered.append(out)
        return len(offered) < 3

    yielded = [out async for out in engine.generate(_request("b", max_tokens=6), sink)]
    assert len(offered) == 3 and offered[2] is yielded[0]
    assert _tokens(offered[:2] + yielded) == reference and yielded[-1].finish_reason == "length"
    assert engine.load().num_free_blocks == 64


async def test_abort_ends_a_sunk_stream(engine: MockEngine) -> None:
    taken: list[EngineOutput] = []
    stream = engine.generate(_request("a", max_tokens=500), lambda out: not taken.append(out))
    task = asyncio.create_task(anext(stream))
    while not taken:
        await asyncio.sleep(0)
    await engine.abort("a")
    assert (await task).finish_reason == "abort"
    assert engine.load().num_free_blocks == 64 and engine.load().num_running == 0
