"""The kvtier connector's scheduler-side bookkeeping: exact load and write-through plans."""

from __future__ import annotations

import pytest

from services.worker.engines.vllm.tier.plan import (
    BlockPlan,
    RequestState,
    load_plan,
    max_loadable_blocks,
    save_plan,
    split_plan,
)

BS = 32
HASHES = [101, 102, 103, 104, 105]  # a prompt of 5 full blocks (+ maybe a partial one)


@pytest.mark.parametrize(("num_prompt_tokens", "expected"), [(0, 0), (1, 0), (32, 0), (33, 1), (64, 1), (65, 2),
                                                              (5 * 32 + 7, 5)])
def test_the_last_prompt_token_is_never_loaded(num_prompt_tokens: int, expected: int) -> None:
    assert max_loadable_blocks(num_prompt_tokens, BS) == expected


def test_load_plan_maps_tier_blocks_after_the_local_hit_to_their_vllm_blocks() -> None:
    # vLLM holds 2 blocks locally (its blocks 7, 3); the tier holds the next 2, which vLLM put in blocks 9, 4.
    plan = load_plan("r", HASHES, num_computed_tokens=2 * BS, num_external_tokens=2 * BS,
                     request_block_ids=[7, 3, 9, 4, 11, 12], block_size=BS)
    assert plan == BlockPlan("r", (103, 104), (9, 4))
    assert load_plan("r", HASHES, 0, 3 * BS, [5, 6, 7, 8], BS) == BlockPlan("r", (101, 102, 103), (5, 6, 7))


def test_no_load_without_external_tokens() -> None:
    assert load_plan("r", HASHES, 2 * BS, 0, [7, 3, 9], BS) is None


def test_a_load_past_the_prompt_or_the_allocation_is_a_bug() -> None:
    with pytest.raises(ValueError):
        load_plan("r", HASHES, 4 * BS, 2 * BS, [1, 2, 3, 4, 5, 6], BS)
    with pytest.raises(ValueError):
        load_plan("r", HASHES, 0, 3 * BS, [1, 2], BS)


def test_save_plan_covers_the_full_blocks_the_request_computed() -> None:
    ids = [7, 3, 9, 4, 11, 12]  # the 6th block holds the partial tail: never saved
    assert save_plan("r", HASHES, 2, ids) == BlockPlan("r", (103, 104, 105), (9, 4, 11))
    assert save_plan("r", HASHES, 0, ids) == BlockPlan("r", tuple(HASHES), (7, 3, 9, 4, 11))
    assert save_plan("r", HASHES, 5, ids) is None  # everything came from caches


def test_prefill_done_when_the_scheduled_chunk_reaches_the_prompt_end() -> None:
    state = RequestState(prompt_hashes=HASHES, num_prompt_tokens=5 * BS + 7)
    assert not state.prefill_done_after(0, 100)
    assert not state.prefill_done_after(100, 66)
    assert state.prefill_done_after(100, 67)
    assert state.prefill_done_after(5 * BS + 7, 1)  # decode steps


@pytest.mark.parametrize(("num_local", "remote", "want"), [
    (2, "", [BlockPlan("r", (103, 104, 105), (9, 4, 11))]),  # no other tier named
    (3, "tcp://b", [BlockPlan("r", (103, 104, 105), (9, 4, 11))]),  # all from the own tier
    (1, "tcp://b", [BlockPlan("r", (103,), (9,)), BlockPlan("r", (104, 105), (4, 11), "tcp://b")]),
    (0, "tcp://b", [BlockPlan("r", (103, 104, 105), (9, 4, 11), "tcp://b")]),  # own tier held nothing
])
def test_split_plan_loads_the_own_tier_first_then_the_named_one(num_local, remote, want) -> None:
    assert split_plan(BlockPlan("r", (103, 104, 105), (9, 4, 11)), num_local, remote) == want
