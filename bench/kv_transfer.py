"""KV pulls as the decode worker timed them, set against a raw NIXL READ of the same bytes (bench/nixl_read.py).

The worker's WorkerStats carry cumulative sums and its recent pulls one by one (``recent_transfers``, each
with ``seq``, the pull's number). A phase's pulls are the samples numbered after the count at the phase's start.
Per-pull figures matter: a sum over a phase is dominated by its slowest pull, and the raw reference is a
median over repeated READs, so the like-for-like figure is the median pull.

Where a pull's time goes on CPU (strace -T of the decode engine's thread, 100M model fp32, 1,000-token prompt,
25.2 MB in 12 merged descriptors): UCX/CMA copies it in 48 ``process_vm_readv`` calls of 512 KB, 4.9-6.3 ms in
the kernel per pull, idle or with 8 streams decoding, the raw READ's own time on this machine (4.2-5.1 ms); what
a pull adds over the raw READ is outside the copy. Larger UCX segments (UCX_RMA_ZCOPY_MAX_SEG_SIZE 4m, 64m) did
not make the raw READ faster: the copy is memory-bound (~5-6 GB/s on that 2-core VM).
"""

from __future__ import annotations

import math
import statistics


def pulls_between(before: dict, after: dict) -> list[dict]:
    """The pulls a worker finished between two WorkerStats (as dicts); fewer if its window overflowed."""
    first = before.get("num_transfers", 0)
    return [t for t in after.get("recent_transfers", []) if t["seq"] > first]


def _gbps(pull: dict) -> float:
    return pull["num_bytes"] / pull["seconds"] / 1e9


def pull_summary(pulls: list[dict]) -> dict:
    """Per-pull milliseconds (and where NIXL reports it, the part inside the post call) and GB/s."""
    timed = [p for p in pulls if p["seconds"] > 0]
    if not timed:
        return {"n": len(pulls)}
    ms = sorted(p["seconds"] * 1e3 for p in timed)
    gbps = sorted(_gbps(p) for p in timed)
    return {
        "n": len(timed), "bytes_each": sorted({p["num_bytes"] for p in timed}),
        "descriptors_median": statistics.median(p.get("num_descriptors", 0) for p in timed),
        "ms_each": [round(p["seconds"] * 1e3, 3) for p in timed],
        "ms_min": round(ms[0], 3), "ms_median": round(statistics.median(ms), 3), "ms_max": round(ms[-1], 3),
        "post_ms_median": round(statistics.median(p.get("post_seconds", 0.0) * 1e3 for p in timed), 3),
        "gbps_median": round(statistics.median(gbps), 3), "gbps_best": round(gbps[-1], 3),
        # Bytes over summed seconds: what the phase moved per second of pulling (slow pulls weigh most).
        "gbps_aggregate": round(sum(p["num_bytes"] for p in timed) / sum(p["seconds"] for p in timed) / 1e9, 3),
    }


def like_variant(descriptors: float, ref: dict) -> str:
    """The raw READ variant shaped like the pulls: vLLM posts one descriptor per block and layer (here 756) and
    NIXL merges adjacent ones (telemetry descCount, e.g. 12 when both sides' block ids run consecutively), so
    "coalesced" (one per region) or "scattered" (one per block), whichever count is nearer. Unknown (0):
    "coalesced", the faster one."""
    if descriptors <= 0:
        return "coalesced"
    return min(("scattered", "coalesced"), key=lambda k: abs(math.log(ref[k]["num_descriptors"] / descriptors)))


def compare_to_raw(gbps: float, descriptors: float, ref: dict) -> dict:
    """``gbps`` (a median pull's) over the median raw NIXL READ of the same bytes with the same descriptor shape."""
    like = like_variant(descriptors, ref)
    return {"raw_reference": like, "raw_nixl_read_gbps_median": ref[like]["gbps_median"],
            "fraction_of_raw_nixl_read": round(gbps / ref[like]["gbps_median"], 3),
            "fraction_of_raw_scattered": round(gbps / ref["scattered"]["gbps_median"], 3),
            "fraction_of_raw_coalesced": round(gbps / ref["coalesced"]["gbps_median"], 3)}


def pulls_against_raw(pulls: list[dict], ref: dict | None) -> dict:
    """``pull_summary`` plus, given a raw reference, the median pull's fraction of it."""
    summary = pull_summary(pulls)
    if ref is not None and "gbps_median" in summary:
        summary["vs_raw"] = compare_to_raw(summary["gbps_median"], summary["descriptors_median"], ref)
    return summary
