"""Releasing a finished prefill's KV blocks at once when its decode will not come (vLLM 0.32, NIXL pull and push).

vLLM keeps a finished ``do_remote_decode`` request's blocks until the decode engine says it has them (pull: the
READ's notification; push: the WRITE done) or until its lease (``kv_lease_duration``, 30 s) runs out, and its
scheduler ignores an abort of a request that has finished (``Scheduler.finish_requests`` skips it), so an abort
alone frees nothing. The lease lives in the NIXL connector's worker side: ``_reqs_to_send`` maps vLLM's request
id to the ``time.perf_counter()`` its lease ends, and every engine step's ``get_finished`` reports the ids whose
end has passed as finished sending, after which the scheduler frees their blocks (``_free_blocks``). So the
release moves that end to now, in the worker, through ``AsyncLLM.collective_rpc`` (vLLM runs it between engine
steps, in the thread that steps). The engine keeps stepping while a finished request still holds blocks
(``Scheduler.has_finished_requests``), so the next step frees them; an idle engine is not idle while it does.

A request that finished in the last step may not be in ``_reqs_to_send`` yet: the scheduler hands its lease to
the worker with the next step's metadata, and until then the worker knows it only in ``_reqs_to_process``
("pending"); ``release_lease`` asks again after a short wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import structlog

QUALNAME = "services.worker.engines.vllm.lease_release.KvLeaseRelease"
RELEASE_RPC = "splitserve_release_kv_leases"
PENDING_RETRY_S = 0.02  # one engine step of an idle engine is ~1 ms: the lease reaches the worker by then
MAX_PENDING_TRIES = 100

log = structlog.get_logger(__name__)

Release = Literal["released", "pending", "unknown"]


def expire_leases(reqs_to_send: dict[str, float], reqs_to_process: set[str], request_ids: Iterable[str],
                  now: float) -> dict[str, Release]:
    """End each request's lease at ``now`` (perf_counter seconds) in a connector worker's lease table.

    "released": its lease ends now (the next ``get_finished`` reports it); "pending": finished or running but its
    lease not handed to the worker yet; "unknown": not held here (already sent, expired, or never a prefill)."""
    out: dict[str, Release] = {}
    for request_id in request_ids:
        if request_id in reqs_to_send:
            reqs_to_send[request_id] = min(reqs_to_send[request_id], now)
            out[request_id] = "released"
        else:
            out[request_id] = "pending" if request_id in reqs_to_process else "unknown"
    return out


def merge(results: Iterable[dict[str, Release]]) -> dict[str, Release]:
    """One answer per id over every connector (and every worker of a TP group): the strongest wins."""
    rank = {"unknown": 0, "pending": 1, "released": 2}
    out: dict[str, Release] = {}
    for result in results:
        for request_id, state in result.items():
            if rank[state] > rank[out.get(request_id, "unknown")]:
                out[request_id] = state
            out.setdefault(request_id, state)
    return out


def _nixl_workers(connector: Any) -> Iterator[Any]:
    """The NIXL connector workers (pull or push) inside vLLM's worker-side connector, a MultiConnector's too."""
    for child in getattr(connector, "sub_connectors", ()):  # MultiConnector's property
        yield from _nixl_workers(child)
    worker = getattr(connector, "connector_worker", None)
    if worker is not None and hasattr(worker, "_reqs_to_send"):
        yield worker


class KvLeaseRelease:
    """vLLM worker extension (``worker_extension_cls``): a method the engine calls in every worker."""

    def splitserve_release_kv_leases(self, request_ids: list[str]) -> dict[str, Release]:
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

        if not has_kv_transfer_group():
            return dict.fromkeys(request_ids, "unknown")
        now = time.perf_counter()
        return merge(expire_leases(w._reqs_to_send, w._reqs_to_process, request_ids, now)
                     for w in _nixl_workers(get_kv_transfer_group()))


async def release_lease(llm: Any, vllm_request_id: str) -> Release:
    """End one finished prefill's lease now in the engine ``llm`` (an AsyncLLM); what the workers answered."""
    state: Release = "unknown"
    for _ in range(MAX_PENDING_TRIES):
        state = merge(await llm.collective_rpc(RELEASE_RPC, args=([vllm_request_id],))).get(vllm_request_id,
                                                                                           "unknown")
        if state != "pending":
            return state
        await asyncio.sleep(PENDING_RETRY_S)
    return state


async def abort_or_release(llm: Any, request_id: str, vllm_request_id: str | None) -> None:
    """Abort ``request_id`` in vLLM, or, for a finished prefill still holding its KV (``vllm_request_id``: vLLM's
    own id of it, from its kv_transfer_params), end that lease now: vLLM's abort skips finished requests."""
    if vllm_request_id is None:
        await llm.abort(request_id)
    else:
        log.info("kv_lease_released", request_id=request_id, state=await release_lease(llm, vllm_request_id))


def worker_extension(progress_spin: bool) -> str:
    """vLLM's ``worker_extension_cls`` for an engine with a NIXL role: both classes release leases; nixl.py's
    also puts the progress thread to sleep (and importing it patches vLLM, so only the worker process does)."""
    if progress_spin:
        return QUALNAME
    from services.worker.engines.vllm.nixl import QUALNAME as SLEEPING_PROGRESS_THREAD

    return SLEEPING_PROGRESS_THREAD
