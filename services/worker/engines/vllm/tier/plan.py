"""Scheduler-side bookkeeping of the kvtier connector: which blocks to load, which to write through.

Pure (no vLLM, no sockets), so it is tested with exact expectations. Token counts are vLLM's; ``block_size``
tokens per block; hashes are ours (``common.hashing``), block ids vLLM's.

Load: vLLM tells the connector how many prompt tokens it holds locally (``num_computed_tokens``, a multiple of
``block_size``); the tier may hold the next blocks. At least one prompt token must be left to compute (vLLM
needs logits), so at most ``(num_prompt_tokens - 1) // block_size`` blocks can come from anywhere.

Save (write-through): once a request's prefill is done, the full prompt blocks it computed itself (past the
local and tier hits it started with) go to kvtier. vLLM's connector API does not expose engine evictions, so
blocks are offered when computed, not when evicted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BlockPlan:
    """Blocks of one request to move: ``block_hashes[i]`` (ours) <-> vLLM block ``block_ids[i]``."""

    req_id: str
    block_hashes: tuple[int, ...]
    block_ids: tuple[int, ...]
    # The kvtier to load them from: "" = this worker's own (``--kvtier``), else another host's endpoint.
    source: str = ""


def max_loadable_blocks(num_prompt_tokens: int, block_size: int) -> int:
    """Full blocks that may be loaded: the prompt's last token is always computed."""
    return max(0, num_prompt_tokens - 1) // block_size


def load_plan(req_id: str, prompt_hashes: Sequence[int], num_computed_tokens: int, num_external_tokens: int,
              request_block_ids: Sequence[int], block_size: int) -> BlockPlan | None:
    """The blocks to fill from the tier, given what vLLM allocated (``request_block_ids``: all the request's
    blocks, local hits first). None when nothing is to be loaded."""
    num_blocks = num_external_tokens // block_size
    if num_blocks <= 0:
        return None
    first = num_computed_tokens // block_size
    end = first + num_blocks
    if end > len(prompt_hashes) or end > len(request_block_ids):
        raise ValueError(f"{req_id}: loading blocks [{first}, {end}) but the prompt has {len(prompt_hashes)} "
                         f"hashed blocks and vLLM allocated {len(request_block_ids)}")
    return BlockPlan(req_id, tuple(prompt_hashes[first:end]), tuple(request_block_ids[first:end]))


def split_plan(plan: BlockPlan, num_local: int, remote: str) -> list[BlockPlan]:
    """``plan``'s first ``num_local`` blocks from the own tier, the rest from ``remote`` (in that order: a load
    that fails part way is recomputed from there on). Empty parts are left out."""
    if not remote or num_local >= len(plan.block_ids):
        return [plan]
    parts = [BlockPlan(plan.req_id, plan.block_hashes[:num_local], plan.block_ids[:num_local]),
             BlockPlan(plan.req_id, plan.block_hashes[num_local:], plan.block_ids[num_local:], remote)]
    return [p for p in parts if p.block_ids]


def save_plan(req_id: str, prompt_hashes: Sequence[int], first_computed_block: int,
              request_block_ids: Sequence[int]) -> BlockPlan | None:
    """The full prompt blocks from ``first_computed_block`` on (those this request computed); None if none."""
    end = min(len(prompt_hashes), len(request_block_ids))
    if first_computed_block >= end:
        return None
    return BlockPlan(req_id, tuple(prompt_hashes[first_computed_block:end]),
                     tuple(request_block_ids[first_computed_block:end]))


@dataclass(slots=True)
class RequestState:
    """What the scheduler-side connector remembers about one request."""

    # Our hashes of the prompt's full blocks (all of them: the write-through needs the last one too).
    prompt_hashes: list[int]
    num_prompt_tokens: int
    # Set by the last probe: tokens vLLM holds locally, and how many tier blocks follow them.
    num_computed_tokens: int = 0
    num_tier_blocks: int = 0
    # Of those, the ones past the own tier's run, from another host's tier (``remote``, named by the router).
    num_remote_blocks: int = 0
    remote: str = ""
    # Index of the first block this request computes itself (None until first scheduled).
    first_computed_block: int | None = None
    saved: bool = False
    # Pending load, emitted in the next connector metadata.
    loads: list[BlockPlan] = field(default_factory=list)

    def prefill_done_after(self, num_computed_tokens: int, num_scheduled_tokens: int) -> bool:
        return num_computed_tokens + num_scheduled_tokens >= self.num_prompt_tokens
