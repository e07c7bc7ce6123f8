"""Two consecutive output slices of one request as one, for a consumer that fell behind its producer.

A zero-delay engine step makes one token per running request; a frontend busy with other streams finds several of
one request's slices queued when it comes back to it. Taken one at a time, each costs a pass through every layer
of the answer path (pipeline, choices, answer loop, detokenizer, metrics, an SSE chunk); taken together, one pass.
vLLM's API server does the same (``RequestOutputCollector`` merges the delta outputs its consumer has not yet
taken), so a client sees one chunk per token while the server keeps up and a chunk of several when it does not.
"""

from __future__ import annotations

from common.protocol import Tokens


def merged(first: object, then: object) -> Tokens | None:
    """``first`` followed by ``then`` as one slice, or None where they must stay apart: they are not both slices
    of the same unfinished request, or either carries what only a slice of its own says (a prefill's KV hand-off,
    prompt logprobs: the request's first slice alone has them)."""
    if (not isinstance(first, Tokens) or not isinstance(then, Tokens) or then.request_id != first.request_id
            or first.finish_reason is not None or first.kv_transfer is not None or then.kv_transfer is not None or then.prompt_logprobs
            or bool(first.logprobs) != bool(then.logprobs) and bool(first.token_ids) and bool(then.token_ids)):
        return None
    return Tokens(
        request_id=first.request_id,
        token_ids=first.token_ids + then.token_ids,
        finish_reason=then.finish_reason,
        num_prompt_tokens=first.num_prompt_tokens or then.num_prompt_tokens,
        num_cached_tokens=first.num_cached_tokens,
        transfer_failed=first.transfer_failed or then.transfer_failed,
        logprobs=first.logprobs + then.logprobs,
        prompt_logprobs=first.prompt_logprobs,
    )
