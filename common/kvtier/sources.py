"""Which kvtier a worker loads a prompt's blocks from: its own host's first, another host's when moving the
rest of the prefix over the network costs less than computing it.

Two halves, both pure:

* ``pick_remote_tier`` (the router, which knows every tier's node and the links' bandwidths): given how many
  leading blocks of the prompt each tier holds, name the one other-host tier worth loading from past the own
  host's run, or none. Worth it when ``latency_s + extra_blocks * block_bytes / link bytes_per_s`` is less
  than ``extra_blocks * block_tokens / prefill_tokens_per_s``: the seconds saved must be positive.
  ``seconds_saved`` is that arithmetic alone; the router's tier credit (``services/router/tier_credit.py``) uses
  it for the host and disk tiers too.
* ``load_sources`` (the worker's connector, which probes both tiers): the own tier's leading run, then the named
  tier's run right after it; blocks are loaded in that order, so a failure anywhere costs a recompute from there.

The named tier travels as an endpoint string (``Route.kvtier_remote`` -> ``Generate.kvtier_remote`` -> vLLM's
``kv_transfer_params["kvtier_remote"]``); "" means none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

# no_longer_run: no other-host tier holds more of the prompt than the own host's tier;
# recompute_cheaper: one does, but computing those blocks beats moving them; remote_cheaper: named.
PickReason = Literal["no_longer_run", "recompute_cheaper", "remote_cheaper"]


@dataclass(frozen=True, slots=True)
class TierRun:
    tier_id: str
    endpoint: str  # what workers dial (the tier's advertised endpoint)
    node: str
    num_blocks: int  # leading blocks of the prompt the tier holds


class Link(NamedTuple):
    bytes_per_s: float
    latency_s: float  # fixed seconds per move


class RemoteTierPick(NamedTuple):
    tier: TierRun | None
    reason: PickReason
    num_extra_blocks: int = 0  # past the own host's run
    seconds_saved: float = 0.0  # compute seconds minus move seconds of those blocks


def seconds_saved(num_blocks: int, block_tokens: int, block_bytes: int, prefill_tokens_per_s: float,
                  link: Link) -> float:
    """Seconds that loading ``num_blocks`` over ``link`` saves against computing them at ``prefill_tokens_per_s``:
    ``num_blocks * block_tokens / rate - (latency_s + num_blocks * block_bytes / bytes_per_s)``. Negative when
    recomputing is faster; 0 for no blocks (nothing moves, no latency)."""
    if num_blocks <= 0:
        return 0.0
    move_s = link.latency_s + num_blocks * block_bytes / link.bytes_per_s
    return num_blocks * block_tokens / prefill_tokens_per_s - move_s


def pick_remote_tier(node: str, runs: Sequence[TierRun], num_loadable_blocks: int, block_tokens: int,
                     block_bytes: int, prefill_tokens_per_s: float,
                     link_to: Callable[[str], Link]) -> RemoteTierPick:
    """The other-host tier to load from past the own host's tier (``node``'s), or None with the reason.

    ``num_loadable_blocks``: the prompt's blocks that may come from anywhere (its last token is computed);
    ``link_to(src_node)``: the link from a tier's node to ``node``. Among tiers that save time the one saving
    most wins; equal savings go to the lower tier id (deterministic).
    """
    if prefill_tokens_per_s <= 0:
        raise ValueError("prefill_tokens_per_s must be positive")
    local = min(max((r.num_blocks for r in runs if r.node == node), default=0), num_loadable_blocks)
    best: RemoteTierPick | None = None
    longer = False
    for run in sorted(runs, key=lambda r: r.tier_id):
        extra = min(run.num_blocks, num_loadable_blocks) - local
        if run.node == node or extra <= 0:
            continue
        longer = True
        saved = seconds_saved(extra, block_tokens, block_bytes, prefill_tokens_per_s, link_to(run.node))
        if saved > 0 and (best is None or saved > best.seconds_saved):
            best = RemoteTierPick(run, "remote_cheaper", extra, saved)
    if best is not None:
        return best
    return RemoteTierPick(None, "recompute_cheaper" if longer else "no_longer_run")


class LoadSources(NamedTuple):
    num_local: int  # leading blocks from the own tier
    num_remote: int  # the blocks right after them, from the named tier
    remote: str  # its endpoint ("" when num_remote is 0)


def load_sources(num_local: int, remote: str, num_remote_probed: int, num_loadable: int) -> LoadSources:
    """What to load: the own tier's run, then what the named tier holds right after it (asked for the blocks
    past the own run: ``num_remote_probed``), all within ``num_loadable`` blocks."""
    num_local = max(0, min(num_local, num_loadable))
    num_remote = max(0, min(num_remote_probed, num_loadable - num_local)) if remote else 0
    return LoadSources(num_local, num_remote, remote if num_remote else "")
