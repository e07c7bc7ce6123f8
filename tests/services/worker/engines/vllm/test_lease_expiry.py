"""The pure part of releasing a finished prefill's KV lease in vLLM's NIXL connector worker (lease_release.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from services.worker.engines.vllm.lease_release import (
    RELEASE_RPC,
    abort_or_release,
    expire_leases,
    merge,
    release_lease,
)


def test_expire_moves_the_lease_end_to_now() -> None:
    reqs_to_send = {"a": 130.0, "b": 140.0, "c": 90.0}
    reqs_to_process = {"a", "b", "c", "running"}
    states = expire_leases(reqs_to_send, reqs_to_process, ["a", "c", "running", "gone"], now=100.0)
    assert states == {"a": "released", "c": "released", "running": "pending", "gone": "unknown"}
    # get_finished reports what has `now >= expires`: a and c now; b keeps its lease; c's earlier end stays.
    assert reqs_to_send == {"a": 100.0, "b": 140.0, "c": 90.0}
    assert reqs_to_process == {"a", "b", "c", "running"}  # vLLM's own expiry removes them, as for a lease run out


def test_merge_takes_the_strongest_answer() -> None:
    # A MultiConnector's kvtier child, or a TP peer, may not know the request: the NIXL worker that does wins.
    assert merge([{"a": "unknown", "b": "pending"}, {"a": "released", "b": "unknown"}, {"c": "unknown"}]) == \
        {"a": "released", "b": "pending", "c": "unknown"}


class _Llm:
    """AsyncLLM's two calls used here; the lease reaches the worker after ``pending_calls`` RPCs."""

    def __init__(self, pending_calls: int) -> None:
        self.pending_calls = pending_calls
        self.rpcs: list[tuple[str, Any]] = []
        self.aborted: list[str] = []

    async def collective_rpc(self, method: str, args: tuple = ()) -> list[dict[str, str]]:
        self.rpcs.append((method, args))
        state = "pending" if len(self.rpcs) <= self.pending_calls else "released"
        return [{args[0][0]: state}]

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def test_release_asks_again_while_the_lease_is_on_its_way() -> None:
    llm = _Llm(pending_calls=2)
    assert asyncio.run(release_lease(llm, "r1-abcd1234")) == "released"
    assert llm.rpcs == [(RELEASE_RPC, (["r1-abcd1234"],))] * 3


def test_abort_or_release() -> None:
    llm = _Llm(pending_calls=0)
    asyncio.run(abort_or_release(llm, "r1", None))  # running, or nothing held: vLLM's abort
    asyncio.run(abort_or_release(llm, "r2", "r2-abcd1234"))  # a finished prefill: its lease ends now
    assert llm.aborted == ["r1"] and llm.rpcs == [(RELEASE_RPC, (["r2-abcd1234"],))]


def test_the_nixl_workers_inside_a_multi_connector() -> None:
    from services.worker.engines.vllm.lease_release import _nixl_workers

    class Worker:
        def __init__(self) -> None:
            self._reqs_to_send: dict[str, float] = {}

    class Nixl:
        def __init__(self) -> None:
            self.connector_worker = Worker()

    class Tier:  # our kvtier connector: no NIXL lease table
        connector_worker = None

    class Multi:
        def __init__(self, *children: object) -> None:
            self._children = list(children)

        @property
        def sub_connectors(self) -> list[object]:
            return self._children

    nixl = Nixl()
    assert list(_nixl_workers(Multi(nixl, Tier()))) == [nixl.connector_worker]
    assert list(_nixl_workers(nixl)) == [nixl.connector_worker]
    assert list(_nixl_workers(Tier())) == []
