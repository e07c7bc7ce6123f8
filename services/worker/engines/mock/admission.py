"""What the mock engine admits: a request checked against the model length and the KV pool, as the
scheduler's ``SeqSpec`` (``EngineError`` when it can never run); a hand-off as its continuation first."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from common.continuation import continuation, prefill_sampling
from common.errors import EngineError
from common.hashing import adapter_seed
from services.worker.engine import EngineRequest
from services.worker.engines.mock.block_manager import BlockManager
from services.worker.engines.mock.scheduler import SeqSpec

_MAX_TOKEN_ID = 2**32 - 1  # block hashes pack token ids as u32


def as_continuation(request: EngineRequest) -> EngineRequest:
    """A hand-off as the mock serves it (common/continuation.py): token_ids the prompt plus the prefill's first
    token, the budget what is still to come; its KV source stays the hand-off's. Any other request as it is."""
    if request.handoff is None or request.prefill_only:
        return request
    token_ids, sampling = continuation(request.token_ids, request.sampling, (request.handoff.first_token_id,))
    return dataclasses.replace(request, token_ids=token_ids, sampling=sampling)


def seq_spec(request: EngineRequest, max_model_len: int, blocks: BlockManager, kv_transfer: str = "pull",
             lora_names: Collection[str] = ()) -> SeqSpec:
    token_ids = request.token_ids
    sampling = request.sampling
    if request.lora_name and request.lora_name not in lora_names:
        raise EngineError(f"request {request.request_id!r}: adapter {request.lora_name!r} is not loaded here")
    if not token_ids:
        raise EngineError(f"request {request.request_id!r} has an empty prompt")
    if min(token_ids) < 0 or max(token_ids) > _MAX_TOKEN_ID:  # in C: a Python loop cost ~0.1 ms per 2k tokens
        raise EngineError(f"request {request.request_id!r} has token ids outside u32")
    if request.prefill_only and request.handoff is not None:
        raise EngineError(f"request {request.request_id!r} is both prefill_only and a hand-off")
    if request.kv_transfer is not None and request.kv_transfer.mode != kv_transfer:
        raise EngineError(f"request {request.request_id!r}: the prefill engine moves KV by "
                          f"{request.kv_transfer.mode}, this decode engine by {kv_transfer}")
    if request.prefill_only:
        sampling = prefill_sampling(sampling)
    max_tokens = sampling.max_tokens
    if max_tokens < 1:
        raise EngineError(f"request {request.request_id!r}: max_tokens must be >= 1")
    num_total = len(token_ids) + max_tokens
    if num_total > max_model_len:
        raise EngineError(
            f"request {request.request_id!r}: {len(token_ids)} prompt + {max_tokens} output tokens "
            f"exceed max_model_len {max_model_len}"
        )
    # The last sampled token is never computed, so it needs no KV slot.
    if blocks.blocks_for(num_total - 1) > blocks.num_blocks:
        raise EngineError(
            f"request {request.request_id!r} needs more than the {blocks.num_blocks} KV blocks of the pool"
        )
    return SeqSpec(
        seq_id=request.request_id,
        token_ids=tuple(token_ids),
        max_tokens=max_tokens,
        # As in vLLM, ignore_eos drops only the model's end tokens (the caller leaves them out of the list).
        stop_token_ids=frozenset(sampling.stop_token_ids),
        prefill_only=request.prefill_only,
        kv_transfer=request.kv_transfer is not None,
        priority=sampling.priority,
        hash_seed=adapter_seed(blocks.hash_seed, request.lora_name) if request.lora_name else None,
    )
