"""Prefix credit in seconds: what a request's cached blocks on one worker save, in blocks' worth of its prefill.

A device block is reused in place and saves a whole block's compute. A block in the host or disk tier must be
fetched first, so it saves its recompute seconds at the worker's prefill rate minus its fetch seconds at that
tier's bandwidth (``common.kvtier.sources.seconds_saved``, the arithmetic the remote-tier pick uses), clamped to
[0, recompute]; credited as ``saved_s / recompute_s_per_block`` blocks, the unit the kv cost counts in. So a
disk slower than recomputing earns nothing, a fast host tier nearly a whole block, and a slow worker (low
prefill rate) values the same tier blocks more than a fast one.

Tier speeds (``TierConfig``): the configured (or profiled) figures seed them; once workers report tier loads
(``TierLoadSample`` on heartbeats) the router fits them (services/router/tier_speeds.py) and passes the fit
here. Pure functions of their arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.kvtier.sources import Link, seconds_saved
from services.router.index import TierOverlap


@dataclass(frozen=True)
class TierConfig:
    # Host tier: bench/tiers.py onboarded a 2,000-token prompt from kvtier's host pool at 2.9 GB/s including
    # lookup and checksums (the NIXL READ alone 4.1 GB/s; docs/architecture.md#kv-tiers).
    host_bytes_per_s: float = 2.9e9
    # Disk tier: NIXL's POSIX backend with O_DIRECT reads scattered blocks at ~1 GB/s on these machines
    # (docs/architecture.md#nixl-facts); kvtier reads them into bounce slots, then the worker READs the slots.
    disk_bytes_per_s: float = 1.0e9
    # Fixed seconds per load (the connector's kvtier lookup round trip and the READ's post; disk adds kvtier's
    # read into bounce slots). Estimates, not measured apart from the whole onboarding above.
    host_latency_s: float = 0.001
    disk_latency_s: float = 0.002

    def __post_init__(self) -> None:
        if not (self.host_bytes_per_s > 0 and self.disk_bytes_per_s > 0):
            raise ValueError("tier bandwidths must be positive")
        if self.host_latency_s < 0 or self.disk_latency_s < 0:
            raise ValueError("tier latencies must be >= 0")

    @property
    def host(self) -> Link:
        return Link(self.host_bytes_per_s, self.host_latency_s)

    @property
    def disk(self) -> Link:
        return Link(self.disk_bytes_per_s, self.disk_latency_s)


def blocks_saved(num_blocks: int, block_tokens: int, kv_bytes_per_token: int, prefill_tokens_per_s: float,
                 link: Link) -> float:
    """Blocks' worth of prefill that loading ``num_blocks`` over ``link`` saves, in [0, num_blocks].

    ``kv_bytes_per_token`` 0 (unknown): a load costs its latency only. ``block_tokens`` 0 (unknown): the
    fixed latency cannot be spread over blocks and is left out (bytes and compute both scale per token).
    """
    if num_blocks <= 0:
        return 0.0
    if block_tokens <= 0:
        block_tokens, link = 1, Link(link.bytes_per_s, 0.0)
    recompute_s = block_tokens / prefill_tokens_per_s  # one block's compute at this worker's rate
    saved_s = seconds_saved(num_blocks, block_tokens, block_tokens * kv_bytes_per_token, prefill_tokens_per_s, link)
    return min(max(saved_s, 0.0), num_blocks * recompute_s) / recompute_s


def tier_credit(overlap: TierOverlap, block_tokens: int, kv_bytes_per_token: int, prefill_tokens_per_s: float,
                tiers: TierConfig) -> float:
    """Blocks' worth of prefill the worker's reusable leading blocks save: device blocks 1 each, the next
    ``host - device`` and ``disk - host`` blocks what loading them from that tier saves (``blocks_saved``)."""
    credit = float(overlap.device)
    num_host = overlap.host - overlap.device
    num_disk = overlap.disk - overlap.host
    if num_host > 0:
        credit += blocks_saved(num_host, block_tokens, kv_bytes_per_token, prefill_tokens_per_s, tiers.host)
    if num_disk > 0:
        credit += blocks_saved(num_disk, block_tokens, kv_bytes_per_token, prefill_tokens_per_s, tiers.disk)
    return credit
