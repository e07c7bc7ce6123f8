"""Push WRITEs name their destination engine in vLLM's own NIXL stats (push_peers), and the worker's stats sink
reads it into each sample. The classes patched are subclasses of vLLM 0.32's (the real ones stay as they are in
this process); the push worker is a stand-in with vLLM's ``_xfer_blocks`` signature and its done-handle sequence
(``_pop_done_transfers``: telemetry, record, release). The real WRITEs are checked in
tests/e2e/test_vllm_disagg_push.py."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import NixlPushConnectorWorker  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats  # noqa: E402
from vllm.v1.metrics.stats import SchedulerStats  # noqa: E402

from common.protocol import TransferSample  # noqa: E402
from services.worker.engines.vllm.push_peers import DST_KEY, tag_writes  # noqa: E402
from services.worker.engines.vllm.stats import EngineStatsSink  # noqa: E402


class Agent:
    """The two nixl agent calls vLLM makes for a finished transfer."""

    def __init__(self) -> None:
        self.released: list[int] = []

    def get_xfer_telemetry(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(xferDuration=2000.0 * handle, postDuration=1000.0, totalBytes=1_000_000 * handle,
                               descCount=handle)

    def release_xfer_handle(self, handle: int) -> None:
        self.released.append(handle)


class PushWorker:
    def __init__(self, stats_cls: type) -> None:
        self.nixl_wrapper = Agent()
        self.xfer_stats = stats_cls()
        self.next_handle = 0

    def _xfer_blocks(self, read_spec, dst_engine_id, request_id, remote_request_id, local_xfer_side_handle,
                     remote_xfer_side_handle):  # vLLM 0.32's signature; the handle of the posted WRITE
        self.next_handle += 1
        return self.next_handle

    def done(self, handle: int) -> None:  # what vLLM's _pop_done_transfers does with a DONE handle
        self.xfer_stats.record_transfer(self.nixl_wrapper.get_xfer_telemetry(handle))
        self.nixl_wrapper.release_xfer_handle(handle)


def _write(worker: PushWorker, dst: str) -> int:
    # vLLM's _xfer_blocks_for_req passes every argument by keyword.
    return worker._xfer_blocks(read_spec=None, dst_engine_id=dst, request_id="r", remote_request_id="r",
                               local_xfer_side_handle=0, remote_xfer_side_handle=0)


@pytest.fixture()
def patched() -> tuple[type, type]:
    worker_cls = type("Worker", (PushWorker,), {})
    stats_cls = type("Stats", (NixlKVConnectorStats,), {})
    assert tag_writes(worker_cls, stats_cls)
    assert not tag_writes(worker_cls, stats_cls)  # once
    return worker_cls, stats_cls


def test_each_write_carries_its_destination_to_the_sink(patched) -> None:
    worker_cls, stats_cls = patched
    worker = worker_cls(stats_cls)
    first, second = _write(worker, "decode-1"), _write(worker, "decode-2")
    worker.done(second)  # WRITEs finish in any order
    worker.done(first)
    # A READ on the same agent (a kv_both engine's pull; not a WRITE): no destination.
    worker.xfer_stats.record_transfer(worker.nixl_wrapper.get_xfer_telemetry(3))
    assert worker.nixl_wrapper.released == [2, 1]
    stats = worker.xfer_stats.clone_and_reset()
    assert stats.data[DST_KEY] == ["decode-2", "decode-1", ""]
    assert worker.xfer_stats.data[DST_KEY] == []  # reset keeps the key
    # Two workers' stats (TP > 1) aggregate in the engine core, pickled on the way; vLLM's class is unpatched
    # there: its aggregate() works on the data as the workers filled it.
    other = stats_cls()
    other.record_transfer(SimpleNamespace(xferDuration=4000.0, postDuration=0.0, totalBytes=64, descCount=1))
    merged = NixlKVConnectorStats(data=pickle.loads(pickle.dumps(stats.data))).aggregate(other)
    sink = EngineStatsSink()
    sink.record_scheduler(SchedulerStats(kv_connector_stats=merged.to_dict()))
    assert sink.transfers.recent() == (
        TransferSample(seq=1, seconds=0.004, num_bytes=2_000_000, num_descriptors=2, post_seconds=0.001,
                       dst_worker_id="decode-2"),
        TransferSample(seq=2, seconds=0.002, num_bytes=1_000_000, num_descriptors=1, post_seconds=0.001,
                       dst_worker_id="decode-1"),
        TransferSample(seq=3, seconds=0.006, num_bytes=3_000_000, num_descriptors=3, post_seconds=0.001),
        TransferSample(seq=4, seconds=0.004, num_bytes=64, num_descriptors=1),
    )


def test_a_released_handle_forgets_its_destination(patched) -> None:
    # A failed WRITE is released without telemetry; the handle number may come back for a later transfer.
    worker_cls, stats_cls = patched
    worker = worker_cls(stats_cls)
    handle = _write(worker, "decode-1")
    worker.nixl_wrapper.release_xfer_handle(handle)
    worker.done(handle)
    assert worker.xfer_stats.data[DST_KEY] == [""]


def test_the_installed_vllm_has_what_the_patch_needs() -> None:
    # Subclasses: the check runs on vLLM's own methods without changing them for the rest of this process.
    worker_cls = type("Worker", (NixlPushConnectorWorker,), {})
    stats_cls = type("Stats", (NixlKVConnectorStats,), {})
    assert tag_writes(worker_cls, stats_cls)
    assert stats_cls().data[DST_KEY] == []
    # A vLLM whose WRITE no longer names its destination engine: refused at import, not mislabelled.
    other = type("Other", (), {"_xfer_blocks": lambda self, handle: 0})
    with pytest.raises(TypeError, match="dst_engine_id"):
        tag_writes(other, type("Stats2", (NixlKVConnectorStats,), {}))
