"""Scheduler: token budget, chunked prefill, decode priority, preemption, finishing, KV loads."""

from __future__ import annotations

import pytest

from services.worker.engines.mock.block_manager import BlockManager
from services.worker.engines.mock.scheduler import (
    KvLoad,
    PrefillChunk,
    Scheduler,
    SchedulerConfig,
    SeqOutput,
    SeqSpec,
    StepPlan,
)

BS = 4
TOKEN = 7  # every sampled token in these tests


def _make(num_blocks: int = 64, max_num_seqs: int = 8, budget: int = 64) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs, budget), BlockManager(num_blocks, BS))


def _spec(seq_id: str, num_prompt: int, max_tokens: int = 100, **kwargs: object) -> SeqSpec:
    prompt = tuple(range(1000, 1000 + num_prompt)) if "prompt" not in kwargs else kwargs.pop("prompt")
    return SeqSpec(seq_id, prompt, max_tokens, **kwargs)  # type: ignore[arg-type]


def _step(sched: Scheduler, token: int = TOKEN) -> tuple[StepPlan, tuple[SeqOutput, ...]]:
    plan = sched.schedule()
    sampling = [chunk.seq_id for chunk in plan.prefills if chunk.samples] + list(plan.decode_seq_ids)
    return plan, sched.update(plan, {seq_id: token for seq_id in sampling})


def test_chunked_prefill_respects_the_token_budget() -> None:
    sched = _make(budget=8)
    sched.add(_spec("a", 20))
    chunks = []
    for _ in range(3):
        plan, outputs = _step(sched)
        chunks.extend(plan.prefills)
        assert plan.num_scheduled_tokens <= 8
    assert chunks == [PrefillChunk("a", 8, False), PrefillChunk("a", 8, False), PrefillChunk("a", 4, True)]
    assert outputs == (SeqOutput("a", TOKEN, None, 0),)
    plan, _ = _step(sched)
    assert plan.decode_seq_ids == ("a",) and plan.prefills == ()
    assert plan.num_decode_kv_tokens == 21


def test_decodes_go_before_new_prefills() -> None:
    sched = _make(budget=8)
    sched.add(_spec("a", 3))
    _step(sched)
    sched.add(_spec("b", 20))
    plan, _ = _step(sched)
    assert plan.decode_seq_ids == ("a",)
    assert plan.prefills == (PrefillChunk("b", 7, False),)
    plan, _ = _step(sched)  # b's ongoing chunk is a running sequence now: after a's decode, before nothing
    assert plan.decode_seq_ids == ("a",) and plan.prefills == (PrefillChunk("b", 7, False),)


def test_max_num_seqs_caps_the_batch() -> None:
    sched = _make(max_num_seqs=2)
    for seq_id in "abc":
        sched.add(_spec(seq_id, 4))
    plan, _ = _step(sched)
    assert [chunk.seq_id for chunk in plan.prefills] == ["a", "b"]
    assert (sched.num_running, sched.num_waiting) == (2, 1)


def test_max_tokens_finishes_with_length_and_frees_blocks() -> None:
    sched = _make(num_blocks=16)
    sched.add(_spec("a", 6, max_tokens=3))
    reasons = [_step(sched)[1][0].finish_reason for _ in range(3)]
    assert reasons == [None, None, "length"]
    assert not sched.has_work() and not sched.has_seq("a")
    assert sched.blocks.num_free_blocks == 16


def test_stop_token_finishes_with_stop() -> None:
    sched = _make()
    sched.add(_spec("a", 5, stop_token_ids=frozenset({42})))
    assert _step(sched, token=1)[1][0].finish_reason is None
    assert _step(sched, token=42)[1][0].finish_reason == "stop"
    assert not sched.has_seq("a")


def test_prefill_only_emits_one_token_and_keeps_prompt_blocks_cached() -> None:
    sched = _make(num_blocks=16)
    spec = _spec("p", 10, max_tokens=1, prefill_only=True)
    sched.add(spec)
    _, outputs = _step(sched)
    assert len(outputs) == 1
    out = outputs[0]
    assert (out.token_id, out.finish_reason) == (TOKEN, "length")
    assert len(out.block_ids) == 3  # ceil(10 / 4): the prompt's KV
    assert sched.blocks.num_free_blocks == 16
    assert sched.blocks.match_prefix(spec.token_ids).block_ids == out.block_ids[:2]


def test_prefix_hit_skips_cached_blocks_but_computes_the_last_token() -> None:
    sched = _make()
    sched.add(_spec("a", 9, max_tokens=1))
    _step(sched)
    sched.add(_spec("b", 9, max_tokens=1))
    plan, outputs = _step(sched)
    assert plan.prefills == (PrefillChunk("b", 1, True),)
    assert outputs[0].num_cached_tokens == 8
    # A block-aligned prompt fully cached still recomputes its last block's last token.
    sched.add(_spec("c", 8, max_tokens=1))
    plan, outputs = _step(sched)
    assert plan.prefills == (PrefillChunk("c", 4, True),)
    assert outputs[0].num_cached_tokens == 4


def test_preemption_frees_the_newest_and_recomputes_it() -> None:
    sched = _make(num_blocks=4)  # 16 token slots
    sched.add(_spec("a", 6, max_tokens=4))
    sched.add(_spec("b", 6, max_tokens=10, prompt=tuple(range(2000, 2006))))
    for _ in range(3):
        plan, _ = _step(sched)
        assert plan.preempted_seq_ids == ()
    # Both now hold 9 tokens with 8 computed: a's next decode needs a third block.
    plan, outputs = _step(sched)
    assert plan.preempted_seq_ids == ("b",)
    assert plan.decode_seq_ids == ("a",)
    assert outputs == (SeqOutput("a", TOKEN, "length", 0, outputs[0].block_ids),)
    assert sched.num_waiting == 1 and sched.token_ids("b") == list(range(2000, 2006)) + [TOKEN] * 3
    # b comes back: its first block survived in the prefix cache, its second was evicted for a.
    plan, outputs = _step(sched)
    assert plan.prefills == (PrefillChunk("b", 5, True),)
    assert outputs[0].finish_reason is None and outputs[0].num_cached_tokens == 0
    assert len(sched.token_ids("b")) == 10


def test_kv_transfer_loads_then_computes_only_the_last_token() -> None:
    sched = _make(num_blocks=16)
    prompt = tuple(range(500, 508)) + (9,)  # 8 prompt tokens + the prefill worker's first token
    sched.add(SeqSpec("k", prompt, 3, kv_transfer=True))
    plan = sched.schedule()
    assert plan.loads == (KvLoad("k", 8, sched.blocks.block_ids("k")),)
    assert plan.prefills == () and len(plan.loads[0].block_ids) == 2
    assert (sched.num_running, sched.num_loading, sched.num_waiting) == (0, 1, 0)
    assert sched.schedule().is_empty  # waiting for the transfer
    assert sched.finish_load("k") and not sched.finish_load("k")
    plan, outputs = _step(sched)
    assert plan.prefills == (PrefillChunk("k", 1, True),)
    assert outputs == (SeqOutput("k", TOKEN, None, 0),)
    # The pulled blocks are in the prefix cache like computed ones.
    assert sched.blocks.match_prefix(prompt).num_cached_tokens == 8


def test_kv_transfer_pulls_only_what_the_local_cache_lacks() -> None:
    sched = _make(num_blocks=16)
    prompt = tuple(range(300, 312))
    sched.add(SeqSpec("local", prompt[:9], 1))
    _step(sched)  # caches prompt[:8]
    sched.add(SeqSpec("k", prompt + (5,), 3, kv_transfer=True))
    plan = sched.schedule()
    assert [(load.seq_id, load.num_tokens) for load in plan.loads] == [("k", 4)]
    sched.finish_load("k")
    _, outputs = _step(sched)
    assert outputs[0].num_cached_tokens == 8
    # Fully cached locally: no transfer at all.
    sched.add(SeqSpec("k2", prompt + (5,), 3, kv_transfer=True))
    plan = sched.schedule()
    assert plan.loads == () and plan.prefills == (PrefillChunk("k2", 1, True),)


def test_loading_sequences_count_against_max_num_seqs() -> None:
    sched = _make(max_num_seqs=1)
    sched.add(SeqSpec("k", tuple(range(9)), 3, kv_transfer=True))
    sched.add(_spec("a", 4))
    plan = sched.schedule()
    assert len(plan.loads) == 1 and plan.prefills == ()
    assert sched.num_waiting == 1


def test_abort_frees_blocks_in_every_state() -> None:
    sched = _make(num_blocks=16, max_num_seqs=2)
    sched.add(_spec("run", 6))
    sched.add(SeqSpec("load", tuple(range(9)), 3, kv_transfer=True))
    sched.add(_spec("wait", 6))
    _step(sched)
    assert (sched.num_running, sched.num_loading, sched.num_waiting) == (1, 1, 1)
    assert all(sched.abort(seq_id) for seq_id in ("run", "load", "wait"))
    assert not sched.abort("run")
    assert not sched.has_work() and sched.num_loading == 0
    assert sched.blocks.num_free_blocks == 16


def test_update_skips_sequences_aborted_during_the_step() -> None:
    sched = _make(num_blocks=16)
    sched.add(_spec("a", 4))
    sched.add(_spec("b", 4))
    plan = sched.schedule()
    sched.abort("a")
    outputs = sched.update(plan, {"b": 1})
    assert [out.seq_id for out in outputs] == ["b"]
    assert sched.num_active_blocks() == 1  # b holds one block and has output


def test_update_skips_a_sequence_added_again_under_an_id_aborted_during_the_step() -> None:
    # A migrated stream: the frontend aborts it and sends it again, same id, to the worker that runs the step.
    sched = _make(num_blocks=16)
    sched.add(_spec("a", 4))
    plan = sched.schedule()
    sched.abort("a")
    sched.add(_spec("a", 6))
    assert sched.update(plan, {"a": 1}) == ()
    assert sched.token_ids("a") == list(_spec("a", 6).token_ids)  # the new one waits, untouched
    _, outputs = _step(sched)
    assert [(out.seq_id, out.token_id) for out in outputs] == [("a", TOKEN)]


def test_queued_prefill_tokens_count_waiting_prompts_and_unfinished_chunks() -> None:
    sched = _make(max_num_seqs=1, budget=8)
    sched.add(_spec("a", 20))
    sched.add(_spec("b", 10))
    sched.add(SeqSpec("k", tuple(range(500, 508)) + (9,), 3, kv_transfer=True))  # only its last token to compute
    assert sched.num_queued_prefill_tokens() == 20 + 10 + 1
    _step(sched)  # a: 8 of 20 computed; b and k wait (one sequence at a time)
    assert sched.num_queued_prefill_tokens() == 12 + 10 + 1
    _step(sched)
    _step(sched)  # a's prompt done: it decodes now and counts no more
    assert sched.num_queued_prefill_tokens() == 10 + 1


@pytest.mark.parametrize("arrivals, started", [
    # (seq id, priority) in arrival order -> the order they start in, one slot at a time
    ([("a", 0), ("b", 0), ("c", 0)], ["a", "b", "c"]),
    ([("a", 5), ("b", 0), ("c", 1), ("d", 0)], ["b", "d", "c", "a"]),  # lower first, arrival order among equals
    ([("a", 0), ("b", -3)], ["b", "a"]),
])
def test_waiting_sequences_start_by_priority(arrivals, started) -> None:
    sched = _make(max_num_seqs=1)
    for seq_id, priority in arrivals:
        sched.add(_spec(seq_id, 4, max_tokens=1, priority=priority))
    order = []
    for _ in arrivals:
        plan, _ = _step(sched)
        order += [chunk.seq_id for chunk in plan.prefills]
    assert order == started
