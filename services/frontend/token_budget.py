"""How many tokens a request may generate, decided once: the one place ``max_tokens`` is derived from a request.

The answer is the budget of the whole request, counting every output token (the prefill worker's first one
included); what each hop of the request does with it is the engine contract's (services/worker/engine.py).
A request that cannot fit the context is the client's error: an OpenAI-shaped 400 naming the limit.
"""

from __future__ import annotations

from services.frontend.context import min_prompt_tokens
from services.frontend.openai_api import ApiError

# OpenAI's completions default when the request names no max_tokens; chat's default is the rest of the context.
COMPLETION_DEFAULT_MAX_TOKENS = 16


def check_prompt_chars(num_chars: int, max_token_chars: int, context_len: int, param: str) -> None:
    """Cheap, before any template or tokenizer work: a prompt surely over the context is a fast 400."""
    if min_prompt_tokens(num_chars, max_token_chars) >= context_len:
        raise ApiError(400, f"prompt of {num_chars} characters is over this server's context of {context_len} "
                       "tokens", param=param, code="context_length_exceeded")


def max_tokens_for(requested: int | None, num_prompt_tokens: int, context_len: int, default: int | None = None,
                   param: str = "messages") -> int:
    """The request's output budget in tokens: ``requested`` if it fits the context, else a 400.

    ``requested`` None: ``default`` if given (completions: 16), else every token the context has left (chat).
    ``param``: the field that carried the prompt, named when the prompt alone is too long."""
    if requested is not None and requested < 1:
        raise ApiError(400, "max_tokens must be at least 1", param="max_tokens")
    if num_prompt_tokens >= context_len:
        raise ApiError(400, f"prompt has {num_prompt_tokens} tokens; this server's context is {context_len} tokens",
                       param=param, code="context_length_exceeded")
    wanted = requested if requested is not None else default
    if wanted is None:
        return context_len - num_prompt_tokens
    if num_prompt_tokens + wanted > context_len:
        raise ApiError(400, f"prompt ({num_prompt_tokens} tokens) plus max_tokens ({wanted}) exceeds "
                       f"the context of {context_len} tokens", param="max_tokens", code="context_length_exceeded")
    return wanted
