"""Effective load: the last report plus what was routed since, until the next report replaces the guess."""

from __future__ import annotations

import pytest

from common.protocol import WorkerInfo, WorkerLoad
from services.router.registry import Registry


def _registry(load: WorkerLoad) -> Registry:
    registry = Registry()
    registry.register(WorkerInfo(worker_id="w", role="prefill", model="m", block_size=16, num_blocks=10,
                                 endpoint="tcp://127.0.0.1:1"), now_s=0.0)
    registry.report("w", load, now_s=1.0)
    return registry


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        # The engine counts queued tokens: routed prompts add theirs.
        (WorkerLoad(num_waiting=1, num_waiting_tokens=300), (3, 800)),
        # It does not (-1): only the request count grows; the cost estimates tokens from it.
        (WorkerLoad(num_waiting=1), (3, -1)),
    ],
)
def test_routed_requests_and_tokens_count_until_the_next_report(reported: WorkerLoad, expected: tuple) -> None:
    registry = _registry(reported)
    registry.note_routed("w", 500)
    registry.note_routed("w")  # a decode-side route: no prompt to compute here
    entry = registry.get("w")
    assert entry is not None
    load = registry.effective_load(entry)
    assert (load.num_waiting, load.num_waiting_tokens) == expected
    registry.report("w", reported, now_s=2.0)
    entry = registry.get("w")
    assert entry is not None and registry.effective_load(entry) == reported


def test_routed_contexts_count_as_active_blocks_until_the_next_report() -> None:
    registry = _registry(WorkerLoad(num_active_blocks=10, num_free_blocks=8, num_total_blocks=10))
    registry.note_routed("w", 40, num_decode_tokens=100)  # 100 tokens of context at block 16: 7 blocks
    registry.note_routed("w", 500)  # prefilled here, decoded elsewhere: no decode blocks
    entry = registry.get("w")
    assert entry is not None
    load = registry.effective_load(entry)
    # Free blocks stay as reported: a prefix hit takes blocks the report counted free (evictable).
    assert (load.num_active_blocks, load.num_free_blocks, load.num_waiting_tokens) == (17, 8, -1)
    registry.report("w", WorkerLoad(num_active_blocks=3), now_s=2.0)
    entry = registry.get("w")
    assert entry is not None and registry.effective_load(entry).num_active_blocks == 3


def test_candidates_skip_excluded_and_draining_workers() -> None:
    registry = Registry()
    for wid, instance in (("a", "ia"), ("b", "ib"), ("c", "ic"), ("d", "id")):
        registry.register(WorkerInfo(worker_id=wid, role="both", model="m", block_size=16, num_blocks=10,
                                     endpoint="tcp://127.0.0.1:1", instance_id=instance), now_s=0.0)
    registry.report("d", WorkerLoad(), now_s=1.0, draining=True)
    registry.note_routed("c", 0, num_decode_tokens=32)
    chosen = registry.candidates("m", frozenset({"both"}), exclude_worker_ids=("a",), exclude_instance_ids=("ib",))
    assert [(c.worker_id, c.load.num_active_blocks) for c in chosen] == [("c", 2)]
    assert registry.candidates("other", frozenset({"both"})) == []


def test_an_adapters_candidates_are_the_workers_holding_it_as_their_beats_say() -> None:
    registry = Registry()
    for wid, loras in (("a", ("sql",)), ("b", ()), ("c", ("sql", "chat"))):
        registry.register(WorkerInfo(worker_id=wid, role="both", model="m", block_size=16, num_blocks=10,
                                     endpoint=f"tcp://127.0.0.1:{len(wid)}", lora_names=loras), now_s=0.0)

    def ids(lora: str) -> list[str]:
        return sorted(c.worker_id for c in registry.candidates("m", frozenset({"both"}), lora_name=lora))

    assert (ids(""), ids("sql"), ids("chat"), ids("poem")) == (["a", "b", "c"], ["a", "c"], ["c"], [])
    assert registry.set_adapters("b", ("poem",)) and not registry.set_adapters("b", ("poem",))
    assert not registry.set_adapters("a", None)  # a beat that says nothing of adapters changes nothing
    assert registry.set_adapters("c", ())
    assert (ids("sql"), ids("chat"), ids("poem")) == (["a"], [], ["b"])
    assert registry.listing("ls").workers[1].lora_names == ("poem",)


def test_a_handoff_on_its_way_counts_until_its_blocks_arrive_and_a_report_follows_or_it_is_past_due() -> None:
    # Prefilled elsewhere, a request is in no report of its decode worker until its KV arrives: a report of no
    # streams must not erase it (the stall rule would prefill locally on an engine a stream is about to join).
    from common.protocol import BlockStored

    registry = _registry(WorkerLoad())
    registry.note_routed("w", 0, 1000, handoff=(3.0, 111))
    registry.note_routed("w", 0, 1000, handoff=(9.0, 222))
    registry.note_routed("w", 64, 1000)  # prefilled here: no hand-off

    def due() -> list[int]:
        return [c.num_handoffs_due for c in registry.candidates("m", frozenset({"prefill"}))]

    registry.report("w", WorkerLoad(), now_s=2.0)
    assert due() == [2]
    registry.note_stored("w", (BlockStored(block_hashes=(5, 222), parent_hash=None, tier="device"),))
    assert due() == [2]  # arrived, but the stream shows in the next report only
    registry.report("w", WorkerLoad(num_running=1), now_s=2.5)
    assert due() == [1]
    registry.report("w", WorkerLoad(num_running=1), now_s=3.5)  # 111 never arrived: past due
    assert due() == [0]
