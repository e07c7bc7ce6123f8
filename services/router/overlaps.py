"""Each worker's cached leading run of a prompt, from every source the router has: the KV-event index, the
approximate index (engines without events) and the pending credit (routed, events not yet in)."""

from __future__ import annotations

from services.router.approx_index import ApproxIndex
from services.router.index import PrefixIndex, TierOverlap


def merged_overlaps(index: PrefixIndex, approx: ApproxIndex, pending: ApproxIndex | None, hashes: list[int],
                    worker_ids: list[str] | None) -> dict[str, TierOverlap]:
    """``worker_ids``: name these workers even without blocks of their own (a shared tier's blocks count for
    every worker); None: only workers the index has blocks for."""
    overlaps = index.overlaps(hashes, worker_ids)
    if approx.num_blocks:
        overlaps.update(approx.overlaps(hashes))
    if pending is not None and pending.num_blocks:
        for worker_id, run in pending.overlaps(hashes).items():
            if not index.credited(worker_id):
                continue  # awaiting its snapshot: no guesses either (fail closed)
            known = overlaps.get(worker_id)
            if known is None:
                overlaps[worker_id] = run
            elif known.device < run.device:
                n = run.device  # blocks on their way to the device: the longer run wins, tier by tier
                overlaps[worker_id] = TierOverlap(n, max(known.host, n), max(known.disk, n))
    return overlaps
