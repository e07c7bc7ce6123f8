"""The admission queue's decisions, as tables: order by priority, fair shares between tenants, deadlines within a
tenant, who is shed with which status, Retry-After."""

from __future__ import annotations

import asyncio
import collections

import pytest

from services.frontend.admission import AdmissionConfig, AdmissionQueue, retry_after_s
from services.frontend.admission_gate import AdmissionGate, request_priority, request_tenant
from services.frontend.openai_api import ApiError


def _queue(**config) -> AdmissionQueue:
    return AdmissionQueue(AdmissionConfig(**config))


def _fill(queue: AdmissionQueue, tenant: str = "t") -> None:
    """Every slot taken by ``tenant``."""
    for i in range(queue.config.max_inflight):
        assert queue.arrive(queue.ticket(f"run{i}-{tenant}", tenant, 0, 0.0)).runs


@pytest.mark.parametrize("arrivals, expected", [
    # (request id, tenant, priority, arrival s) -> the order they start in once slots free up one by one
    ([("a", "t", 5, 0.0), ("b", "t", 0, 1.0), ("c", "t", 1, 2.0)], ["b", "c", "a"]),  # lower value first
    ([("a", "t", 0, 0.0), ("b", "t", 0, 1.0)], ["a", "b"]),  # same priority, same budget: arrival order
    # Priority 0's budget is 1 s, priority 1's 100 s: deadline order within priority 1 is arrival order still.
    ([("a", "t", 1, 0.0), ("b", "t", 1, 1.0), ("c", "t", 0, 5.0)], ["c", "a", "b"]),
])
def test_order_is_priority_then_deadline(arrivals, expected) -> None:
    queue = _queue(max_inflight=1, max_queued=10, ttft_budgets_s=((0, 1.0), (1, 100.0)))
    _fill(queue)
    for rid, tenant, priority, at_s in arrivals:
        assert not queue.arrive(queue.ticket(rid, tenant, priority, at_s)).runs
    order = []
    tenant = "t"
    for _ in arrivals:
        started = queue.finish(tenant)
        order += [t.request_id for t in started]
    assert order == expected


@pytest.mark.parametrize("budgets, priority, budget_s", [
    ((), 3, 10.0),
    (((0, 0.5), (5, 20.0)), -1, 10.0),  # below every listed level: the default
    (((0, 0.5), (5, 20.0)), 0, 0.5),
    (((0, 0.5), (5, 20.0)), 4, 0.5),
    (((0, 0.5), (5, 20.0)), 9, 20.0),
])
def test_ttft_budget_by_priority(budgets, priority, budget_s) -> None:
    assert AdmissionConfig(ttft_budgets_s=budgets).ttft_budget_s(priority) == budget_s


@pytest.mark.parametrize("weights, share_a", [({"a": 3.0, "b": 1.0}, 0.75), ({}, 0.5), ({"a": 1.0, "b": 4.0}, 0.2)])
def test_weighted_fair_queueing_between_backlogged_tenants(weights, share_a) -> None:
    queue = _queue(max_inflight=1, max_queued=400, tenant_weights=weights)
    _fill(queue, "a")
    for i in range(200):
        queue.arrive(queue.ticket(f"a{i}", "a", 0, 0.0))
        queue.arrive(queue.ticket(f"b{i}", "b", 0, 0.0))
    started: list[str] = []
    tenant = "a"
    for _ in range(100):
        (ticket,) = queue.finish(tenant)
        tenant = ticket.tenant
        started.append(tenant)
    assert collections.Counter(started)["a"] / 100 == pytest.approx(share_a, abs=0.02)


def test_a_tenant_back_from_idle_banks_no_credit() -> None:
    queue = _queue(max_inflight=1, max_queued=100)
    _fill(queue, "a")
    for i in range(50):  # a alone for a while: its clock runs ahead
        queue.arrive(queue.ticket(f"a{i}", "a", 0, 0.0))
    tenant = "a"
    for _ in range(20):
        (ticket,) = queue.finish(tenant)
        tenant = ticket.tenant
    for i in range(50):
        queue.arrive(queue.ticket(f"b{i}", "b", 0, 0.0))
    started = []
    for _ in range(20):
        (ticket,) = queue.finish(tenant)
        tenant = ticket.tenant
        started.append(tenant)
    # b does not get 20 in a row for a's past service: the two alternate.
    assert collections.Counter(started) == {"a": 10, "b": 10}


@pytest.mark.parametrize("running, queued, newcomer, shed_id, status", [
    # The tenant in the one slot; (request id, tenant, priority) queued in a full queue of 2; the newcomer; who
    # is shed, with which status. One tenant alone is never over its share: 503.
    ("a", [("q1", "a", 0), ("q2", "a", 5)], ("n", "a", 0), "q2", 503),  # the lowest priority goes, not the newcomer
    ("a", [("q1", "a", 0), ("q2", "a", 0)], ("n", "a", 5), "n", 503),  # the newcomer is the least important
    # Same priority: the tenant furthest over its share goes, with 429 (b holds 3 of 3 places, its fair 1.5).
    ("b", [("q1", "b", 1), ("q2", "b", 1)], ("n", "a", 1), "q2", 429),
    # Priority before shares: a's low-priority newcomer goes although b is further over its share (503: a is not).
    ("b", [("q1", "b", 1), ("q2", "b", 1)], ("n", "a", 7), "n", 503),
])
def test_shedding_takes_the_least_important(running, queued, newcomer, shed_id, status) -> None:
    queue = _queue(max_inflight=1, max_queued=2)
    _fill(queue, running)
    for rid, tenant, priority in queued:
        assert queue.arrive(queue.ticket(rid, tenant, priority, 0.0)).shed == ()
    arrival = queue.arrive(queue.ticket(newcomer[0], newcomer[1], newcomer[2], 1.0))
    assert [(s.ticket.request_id, s.status) for s in arrival.shed] == [(shed_id, status)]
    assert queue.num_queued == 2


def test_no_queue_sheds_past_max_inflight_with_503() -> None:
    queue = _queue(max_inflight=2, max_queued=0)
    _fill(queue)
    arrival = queue.arrive(queue.ticket("n", "t", 0, 0.0))
    assert not arrival.runs and [s.status for s in arrival.shed] == [503]
    assert queue.num_queued == 0 and queue.num_running == 2
    assert queue.finish("t") == [] and queue.arrive(queue.ticket("m", "t", 0, 0.0)).runs


def test_cancel_removes_only_queued() -> None:
    queue = _queue(max_inflight=1, max_queued=4)
    _fill(queue)
    queue.arrive(queue.ticket("q", "t", 0, 0.0))
    assert queue.cancel("q") and not queue.cancel("q") and queue.num_queued == 0
    assert queue.finish("t") == []


@pytest.mark.parametrize("num_queued, max_inflight, mean_s, expected", [
    (0, 8, 0.0, 1), (0, 8, 2.0, 1), (31, 8, 2.0, 8), (10_000, 1, 5.0, 60), (3, 0, 1.0, 1),
])
def test_retry_after(num_queued, max_inflight, mean_s, expected) -> None:
    assert retry_after_s(num_queued, max_inflight, mean_s) == expected


@pytest.mark.parametrize("body, headers, expected", [
    (None, {}, 0), (3, {"x-priority": "-2"}, 3), (None, {"x-priority": " -2 "}, -2),
])
def test_request_priority(body, headers, expected) -> None:
    assert request_priority(body, headers) == expected


def test_request_tenant() -> None:
    assert request_tenant({"x-tenant": "acme", "authorization": "Bearer k"}) == "acme"
    by_key = request_tenant({"authorization": "Bearer k"})
    assert by_key.startswith("key-") and "k" not in by_key[4:].replace("k", "") and by_key != request_tenant(
        {"authorization": "Bearer j"})
    assert request_tenant({}) == "default"


async def test_gate_queues_then_sheds_the_waiter_as_an_api_error() -> None:
    gate = AdmissionGate(AdmissionConfig(max_inflight=1, max_queued=1))
    order: list[str] = []
    release = asyncio.Event()

    async def request(rid: str, priority: int) -> int:
        try:
            async with gate.slot(rid, "t", priority):
                order.append(rid)
                await release.wait()
        except ApiError as exc:
            assert exc.headers[0][0] == b"retry-after"
            return exc.status
        return 200

    first = asyncio.create_task(request("first", 0))
    await asyncio.sleep(0)
    low = asyncio.create_task(request("low", 9))
    await asyncio.sleep(0)
    high = asyncio.create_task(request("high", 0))  # the queue holds one: low is shed for it
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(first, low, high) == [200, 503, 200]
    assert order == ["first", "high"]
    assert gate.queue.num_running == 0 and gate.queue.num_queued == 0


def test_reserved_slots_go_only_to_important_requests() -> None:
    queue = _queue(max_inflight=3, max_queued=10, reserved_inflight=1, reserved_max_priority=0)
    assert queue.arrive(queue.ticket("low1", "t", 5, 0.0)).runs
    assert queue.arrive(queue.ticket("low2", "t", 5, 0.0)).runs
    assert not queue.arrive(queue.ticket("low3", "t", 5, 0.0)).runs  # the last slot is reserved
    assert queue.arrive(queue.ticket("high", "t", 0, 0.0)).runs  # past the queued low one: it may use it
    assert queue.finish("t") == []  # high ended: the reserved slot is free again, still not low3's
    (started,) = queue.finish("t")  # a low one ended: low3 takes its slot
    assert started.request_id == "low3"



@pytest.mark.parametrize("header", ["high", "2147483648", ""])
def test_priority_header_outside_32_bits_or_not_a_number(header) -> None:
    if not header:
        assert request_priority(None, {"x-priority": header}) == 0
        return
    with pytest.raises(ApiError) as exc:
        request_priority(None, {"x-priority": header})
    assert exc.value.status == 400 and exc.value.param == "x-priority"


def test_body_priority_is_read_before_the_parse() -> None:
    from services.frontend.admission_gate import body_priority

    assert body_priority(b'{"model": "m", "priority": -3}') == -3
    assert body_priority(b'{"model": "m"}') is None
    assert body_priority(b'{"priority": "high"}') is None  # the full parse answers the 400
    assert body_priority(b'{"priority": 2147483648}') is None


@pytest.mark.parametrize("priority, status", [(0, None), (-5, None), (2**31, 400), ("1", 400)])
def test_priority_field_is_a_32_bit_integer(priority, status) -> None:
    import json

    from services.frontend.openai_api import parse_chat

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "priority": priority}).encode()
    if status is None:
        assert parse_chat(body).priority == priority
        return
    with pytest.raises(ApiError) as exc:
        parse_chat(body)
    assert exc.value.status == status and exc.value.param == "priority"
