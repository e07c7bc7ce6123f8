"""Names the decode engine each push WRITE went into, inside vLLM's own NIXL transfer stats.

A pull sample (a READ) is timed by the decode engine, and the worker names its source from the request that
pulled (services/worker/transfer_sources.py). A push is timed by its initiator too: the prefill engine, whose NIXL
telemetry of the WRITE (bytes, post-to-completion seconds) means exactly what a pull's READ telemetry means, on
the same prefill -> decode link. But the prefill worker cannot tell which decode worker a WRITE went to: vLLM
matches a decode engine's block registration to the finished prefill inside the engine, after the prefill
request has left the worker, and its telemetry names no peer. The alternative, the decode worker timing from its
registration to the KV's arrival, would add the notification round trip, the prefill engine's matching and
the decode engine's step cadence to the WRITE: not a link's bandwidth.

So, in vLLM's worker process (imported with services/worker/engines/vllm/nixl.py, our ``worker_extension_cls``),
``NixlPushConnectorWorker._xfer_blocks`` remembers each WRITE handle's ``dst_engine_id`` (a worker's engine id is
its worker id), the agent's ``get_xfer_telemetry`` hands that id along with the telemetry when the WRITE is done,
and ``NixlKVConnectorStats.record_transfer`` appends it to a list of its own (``DST_KEY``, one entry per
transfer, "" for a READ) beside vLLM's per-transfer lists. The stats reach the worker through vLLM's scheduler
stats (``to_dict()``: the lists as they are); services/worker/engines/vllm/stats.py reads the list by index.
Not a stable vLLM interface: checked against vLLM 0.32 (tests/services/worker/engines/vllm/test_push_peers.py).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

DST_KEY = "splitserve_dst_engine_id"
_PATCHED = "_splitserve_push_peers"


class TaggedTelemetry:
    """nixl's telemetry of one transfer, plus the engine the transfer wrote into."""

    __slots__ = ("_real", "dst_engine_id")

    def __init__(self, real: Any, dst_engine_id: str) -> None:
        self._real = real
        self.dst_engine_id = dst_engine_id

    def __getattr__(self, name: str) -> Any:  # xferDuration, postDuration, totalBytes, descCount, ...
        return getattr(self._real, name)


def _write_destinations(worker: Any) -> dict[Any, str]:
    """The worker's WRITE handle -> destination engine id map; on first use, its agent's telemetry starts handing
    the destination along and a released handle forgets its entry (handles are reused)."""
    dsts = worker.__dict__.get(_PATCHED)
    if dsts is not None:
        return dsts
    dsts = {}
    agent = worker.nixl_wrapper
    real_telemetry, real_release = agent.get_xfer_telemetry, agent.release_xfer_handle

    def get_xfer_telemetry(handle: Any, *args: Any, **kwargs: Any) -> Any:
        res = real_telemetry(handle, *args, **kwargs)
        dst = dsts.pop(handle, None)
        return res if res is None or dst is None else TaggedTelemetry(res, dst)

    def release_xfer_handle(handle: Any, *args: Any, **kwargs: Any) -> Any:
        dsts.pop(handle, None)
        return real_release(handle, *args, **kwargs)

    agent.get_xfer_telemetry = get_xfer_telemetry
    agent.release_xfer_handle = release_xfer_handle
    worker.__dict__[_PATCHED] = dsts
    return dsts


def tag_writes(worker_cls: type, stats_cls: type) -> bool:
    """Patch ``worker_cls`` (vLLM's NixlPushConnectorWorker) and ``stats_cls`` (NixlKVConnectorStats) as the module
    docstring says. False: patched already."""
    if worker_cls.__dict__.get(_PATCHED, False):
        return False
    real_xfer, real_record, real_reset = worker_cls._xfer_blocks, stats_cls.record_transfer, stats_cls.reset
    signature = inspect.signature(real_xfer)
    if "dst_engine_id" not in signature.parameters:
        raise TypeError(f"{worker_cls.__name__}._xfer_blocks takes no dst_engine_id: not the vLLM this was written for")

    @functools.wraps(real_xfer)  # its signature stays readable (a subclass of a patched class patches again)
    def _xfer_blocks(self: Any, *args: Any, **kwargs: Any) -> Any:
        handle = real_xfer(self, *args, **kwargs)
        if handle is not None:
            dst = signature.bind(self, *args, **kwargs).arguments["dst_engine_id"]
            _write_destinations(self)[handle] = str(dst)
        return handle

    def record_transfer(self: Any, res: Any) -> None:
        real_record(self, res)
        # One entry per recorded transfer (vLLM records nothing for a missing telemetry), once: a subclass of a
        # patched class runs this twice. Entries missing before this one (none, unless recorded unpatched) are "".
        dsts = self.data.setdefault(DST_KEY, [])
        missing = len(self.data["transfer_duration"]) - len(dsts)
        if missing > 0:
            dsts.extend([""] * (missing - 1) + [getattr(res, "dst_engine_id", "")])

    def reset(self: Any) -> None:
        real_reset(self)
        # Every instance has the key: vLLM's aggregate() of two workers' stats indexes self.data by other's keys.
        self.data[DST_KEY] = []

    worker_cls._xfer_blocks = _xfer_blocks
    stats_cls.record_transfer = record_transfer
    stats_cls.reset = reset
    setattr(worker_cls, _PATCHED, True)
    return True


def tag_vllm_push_writes() -> bool:
    """``tag_writes`` on the installed vLLM's classes; False where it has no push connector (or patched already)."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import NixlPushConnectorWorker
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats
    except ImportError:
        return False
    return tag_writes(NixlPushConnectorWorker, NixlKVConnectorStats)
